"""The ``triton`` backend: one launch per module (shrink fused into expand), for every slot at once.

``prepare`` groups adapter tokens by slot (as the grouped backend does: stable sort only when a
slot's tokens are scattered) and cuts each run into blocks of at most ``BLOCK_M`` tokens; the
block table tells the kernels (:mod:`loraplex.ops.triton_kernels`) which arena rows each block
reads, so heterogeneous ranks cost their own rows only. Tokens on slot -1 or an empty slot are
in no block and their ``out`` rows are untouched.

Importing this module does not import triton: the kernels are loaded when a backend is built,
so ``loraplex.ops`` stays importable (and the other backends usable) without triton installed.

NOTE: a slot's rows are the adapter's largest rank; a module where the adapter has a smaller
rank reads the zero rows past it (they add exactly nothing), as the masked backend does.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, fields
from types import ModuleType

import torch

from loraplex.ops.base import ArenaLayout, LoraBatch, ModuleLoraWeights, Segment, Strategy
from loraplex.ops.plan import active_slots, check_token_slots, grouped_batch, none_batch

BLOCK_M = 16  # tokens per block (the smallest tile tl.dot takes on GPUs)
BLOCK_R = 16  # rank tile: a slot costs ceil(rank / 16) tiles
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
KERNELS_MODULE = "loraplex.ops.triton_kernels"


@dataclass(frozen=True)
class TritonBatch(LoraBatch):
    """A grouped batch plus the block table the kernels index (built once per step)."""

    blocks: torch.Tensor | None = None  # [num_blocks, 4] int32: pos_lo, pos_hi, row0, num_rows
    row_scale: torch.Tensor | None = None  # ArenaLayout.row_scale: [num_tables, capacity_rows]


def load_kernels() -> ModuleType:
    """The kernels module; a clear error naming the package when triton is not installed."""
    try:
        return importlib.import_module(KERNELS_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "triton":
            raise
        raise ModuleNotFoundError(
            "backend 'triton' needs the 'triton' package, which is not installed; "
            "expected `pip install triton` (or another backend: masked, grouped, batched, auto)",
            name="triton",
        ) from exc


def block_table(
    segments: tuple[Segment, ...], layout: ArenaLayout
) -> list[tuple[int, int, int, int]]:
    """Each run of equal slots cut into blocks of at most ``BLOCK_M`` positions."""
    rows = []
    for segment in segments:
        row0, num_rows = layout.slot_starts[segment.slot], layout.slot_rows[segment.slot]
        for lo in range(segment.start, segment.end, BLOCK_M):
            rows.append((lo, min(lo + BLOCK_M, segment.end), row0, num_rows))
    return rows


class TritonBackend:
    """A slot-grouped, fused shrink/expand Triton kernel (CUDA; CPU tensors interpreted)."""

    name = "triton"

    def __init__(self) -> None:
        self.kernels = load_kernels()

    @property
    def interpreted(self) -> bool:
        """Whether the kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1``)."""
        return bool(self.kernels.INTERPRETED)

    def prepare(self, token_slots: torch.Tensor, layout: ArenaLayout) -> LoraBatch:
        check_token_slots(token_slots, len(layout.slot_rows))
        slots = active_slots(token_slots, layout)
        if not slots:
            return none_batch(token_slots)
        grouped = grouped_batch(token_slots, layout, slots)
        table = block_table(grouped.segments, layout)
        blocks = torch.tensor(table, dtype=torch.int32).to(token_slots.device)
        return TritonBatch(
            **{f.name: getattr(grouped, f.name) for f in fields(LoraBatch)},
            blocks=blocks,
            row_scale=layout.row_scale,
        )

    def apply(
        self, x: torch.Tensor, out: torch.Tensor, weights: ModuleLoraWeights, batch: LoraBatch
    ) -> torch.Tensor:
        if batch.strategy is Strategy.NONE or not batch.active_tables[weights.table_index]:
            return out
        if not isinstance(batch, TritonBatch) or batch.blocks is None or batch.row_scale is None:
            raise ValueError("batch was not built by the triton backend; expected its prepare()")
        self._check_inputs(x, out, weights, batch)
        scales = batch.row_scale[weights.table_index]  # the kernels read each slot's first row
        self._launch(x, out, weights, batch, blocks=batch.blocks, scales=scales)
        return out

    def _launch(
        self,
        x: torch.Tensor,
        out: torch.Tensor,
        weights: ModuleLoraWeights,
        batch: TritonBatch,
        *,
        blocks: torch.Tensor,
        scales: torch.Tensor,
    ) -> None:
        """One launch adding every block's delta into ``out`` (shrink fused into expand)."""
        lora_a, lora_b = weights.lora_a, weights.lora_b
        order = batch.order if batch.order is not None else blocks  # unread without an order
        # float32 stays IEEE (TF32 would miss 1e-4); see triton_kernels on the bfloat16 upcast.
        dot_fp32 = self.interpreted and x.dtype == torch.bfloat16
        precision = "ieee" if x.dtype == torch.float32 or dot_fp32 else "tf32"
        block_n = tile(out.shape[1])
        self.kernels.lora_kernel[(blocks.shape[0], cdiv(out.shape[1], block_n))](
            x, lora_a, lora_b, out, order, blocks, scales, x.shape[1], out.shape[1],
            x.stride(0), x.stride(1), lora_a.stride(0), lora_a.stride(1),
            lora_b.stride(0), lora_b.stride(1), out.stride(0), out.stride(1),
            USE_ORDER=batch.order is not None, BLOCK_M=BLOCK_M, BLOCK_R=BLOCK_R,
            BLOCK_K=tile(x.shape[1]), BLOCK_N=block_n, DOT_PRECISION=precision,
            DOT_FP32=dot_fp32,
        )  # fmt: skip

    def _check_inputs(
        self, x: torch.Tensor, out: torch.Tensor, weights: ModuleLoraWeights, batch: LoraBatch
    ) -> None:
        """What the kernels assume and torch would otherwise have refused."""
        if x.dtype not in SUPPORTED_DTYPES or x.dtype != weights.lora_a.dtype:
            raise ValueError(
                f"x has dtype {x.dtype} and the arena {weights.lora_a.dtype}; expected one "
                f"of {SUPPORTED_DTYPES}, the same for both"
            )
        if x.dim() != 2 or x.shape != (batch.num_tokens, weights.lora_a.shape[1]):
            raise ValueError(
                f"x has shape {tuple(x.shape)}; expected ({batch.num_tokens}, "
                f"{weights.lora_a.shape[1]})"
            )
        if out.dim() != 2 or out.shape != (batch.num_tokens, weights.lora_b.shape[1]):
            raise ValueError(
                f"out has shape {tuple(out.shape)}; expected ({batch.num_tokens}, "
                f"{weights.lora_b.shape[1]})"
            )
        if x.device.type != "cuda" and not self.interpreted:
            raise ValueError(
                f"x is on {x.device}; expected a CUDA tensor (CPU tensors run only in Triton's "
                f"interpreter: TRITON_INTERPRET=1 set before {KERNELS_MODULE} is imported)"
            )


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def tile(size: int) -> int:
    """A power-of-two tile for a weight dimension: at least 16 (tl.dot), at most 128."""
    return max(16, min(128, 1 << (size - 1).bit_length()))
