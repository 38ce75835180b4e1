"""Which computation a step's LoRA delta uses: the cost model behind the ``auto`` backend.

Kept apart from the computations (``torch_ops``) so the merged pass (``merged_op``) weighs its
gathered tokens with the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loraplex.cpuinfo import this_cpu_bfloat16_emulated, this_cpu_matrix_tiles
from loraplex.ops.base import ArenaLayout, Strategy
from loraplex.ops.batched_plan import block_grid, rank_classes
from loraplex.ops.plan import covered_rows, float32_slots, half_on_cpu


@dataclass(frozen=True)
class StepShape:
    """What :class:`AutoPolicy` weighs, per unit of module width."""

    num_tokens: int  # tokens the op sees
    runs: int  # active slots (grouped: one run each once sorted)
    covered_rows: int  # masked: rows from the first to the last active slot's block
    active_rows: int  # rows the active slots own
    exact_cells: int  # sum over active slots of tokens x rows
    # batched: rows its blocks span (0: batched cannot run)
    block_rows: int = 0
    padded_cells: int = 0  # batched: blocks x most tokens of their slot (class) x rows per block
    half_on_cpu: bool = False  # 16-bit weights on a CPU (skinny matmuls read them slowly)
    on_accelerator: bool = False  # weights on a GPU: a launch costs far more multiply-adds
    # batched: 0 = the active slots share one row grid (one batched matmul pair); n = they do
    # not, and it runs one pair per group of a rank class (batched_plan.rank_classes), gathered
    block_groups: int = 0
    gathered: int = 0  # batched per rank class: adapter tokens copied in and added back
    # grouped's float32 pass (16-bit weights on a CPU, two runs or more): its short runs, their
    # rows and exact cells (every run of at most the cap's tokens; the others stay in the dtype)
    # and the adapter tokens it gathers and copies back; all 0: no run would be short
    float32_runs: int = 0
    float32_rows: int = 0
    float32_cells: int = 0
    adapter_tokens: int = 0
    # bfloat16 weights on a CPU without native bfloat16 arithmetic (cpuinfo.bfloat16_emulated:
    # no avx512_bf16, no amx_bf16): there a matmul's multiply-adds in the dtype are what cost
    half_emulated: bool = False
    # 16-bit weights on a CPU with matrix tiles (cpuinfo.matrix_tiles: AMX), where masked's wide
    # matmuls run at about twice float32's rate (AutoPolicy.half_cpu_masked_divisor)
    half_tiles: bool = True

    @classmethod
    def of(
        cls,
        num_tokens: int,
        tokens: dict[int, int],
        layout: ArenaLayout,
        float32_max_run: int = 0,
        bfloat16_emulated: bool | None = None,
        *,
        matrix_tiles: bool | None = None,
    ) -> StepShape:
        """``tokens``: active slot -> its tokens (plan.active_slot_tokens); ``float32_max_run``:
        most tokens a run of grouped's float32 pass has (0: no float32 pass);
        ``bfloat16_emulated``: whether the CPU lacks native bfloat16 arithmetic (None: this
        CPU's, ``cpuinfo.this_cpu_bfloat16_emulated``); ``matrix_tiles``: whether it has AMX's
        tiles (None: this CPU's, ``cpuinfo.this_cpu_matrix_tiles``)."""
        row_lo, row_hi = covered_rows(layout, list(tokens))
        grid = block_grid(layout, list(tokens))
        groups = gathered = 0
        if grid is not None:
            spanned = grid[1] * grid[2]
            padded = spanned * max(tokens.values())
        else:
            classes = rank_classes(layout, list(tokens))
            groups, gathered = len(classes), sum(tokens.values())
            spanned = sum(len(run) * rows for _, _, rows, run in classes)
            padded = sum(
                len(run) * rows * max(tokens[slot] for slot in run) for _, _, rows, run in classes
            )
        scales = layout.row_scale
        half = half_on_cpu(layout)
        short = float32_slots(tokens, float32_max_run) if half else []
        if bfloat16_emulated is None and half and scales.dtype == torch.bfloat16:
            bfloat16_emulated = this_cpu_bfloat16_emulated()
        emulated = half and scales.dtype == torch.bfloat16 and bool(bfloat16_emulated)
        if matrix_tiles is None and half:
            matrix_tiles = this_cpu_matrix_tiles()
        return cls(
            num_tokens,
            len(tokens),
            row_hi - row_lo,
            sum(layout.slot_rows[slot] for slot in tokens),
            sum(count * layout.slot_rows[slot] for slot, count in tokens.items()),
            spanned,
            padded,
            half,
            scales.device.type != "cpu",
            groups,
            gathered,
            len(short),
            sum(layout.slot_rows[slot] for slot in short),
            sum(tokens[slot] * layout.slot_rows[slot] for slot in short),
            sum(tokens.values()) if short else 0,
            emulated,
            half and bool(matrix_tiles),
        )


@dataclass(frozen=True)
class AutoPolicy:
    """The cheapest of the masked, grouped and batched computations for a step's shape
    (measured; docs/benchmarks/execution.md).

    Masked multiplies every token by every covered row (``num_tokens x covered rows`` per unit of
    module width) and reads every covered row's weights, active or not, in four launches;
    grouped does the exact ``sum(tokens x rank)`` and reads only the active slots' rows, in about
    two launches per run of equal slots (plus a gather and a scatter when scattered); batched
    (only when the active slots share a row grid) pads every slot to the most tokens any has and
    reads every block it spans, in about as many launches as masked. Costs are in multiply-adds
    per unit of width (``ArenaLayout.width``): a launch ``launch_macs``, a weight element read
    ``read_macs`` (decode-sized steps are bound by reading the weights).
    """

    # Measured on the project's 2-core Xeon (float32, one thread): a small op launch ~5 us
    # against ~40 G multiply-adds/s in these skinny matmuls, and a skinny matmul over few tokens
    # runs at the speed of reading its weights (~16 multiply-adds per element read). Fitted
    # when only masked and grouped existed (docs/benchmarks/execution.md), they put the small
    # preset's 16-adapter decode batch on masked and the large preset's on grouped. With
    # batched weighed too, ``choose`` puts both presets' 16-adapter S2 decode batches (float32
    # weights on a CPU) on batched, one matmul pair per rank class, and long prefill runs on
    # grouped; 16-bit weights on a CPU and a GPU put decode batches on masked (the terms below;
    # tests/ops/test_batched.py pins the small preset's), except bfloat16 on a CPU without native
    # bfloat16 arithmetic, where they go grouped (``emulated_mac_factor``).
    launch_macs: int = 196608
    read_macs: int = 16
    min_runs_for_masked: int = 2  # a single run is always grouped (it is already exact)
    # On a CPU, bfloat16/float16 matmuls of one or a few tokens (grouped's and batched's) read
    # their weights about 4x slower than float32's, while masked's 16-token matmul gets faster
    # (large preset, 16 rank-16 adapters, LoRA only: masked 12 ms, batched 24, grouped 48).
    half_cpu_read_factor: int = 4
    # On a GPU a decode-sized LoRA op's arithmetic is nearly free and each launch (the op's
    # dispatch from Python included) is what costs: measured on an H200 (torch 2.11, bfloat16,
    # large preset, batch 32 over the 16 S2 adapters; docs/benchmarks/execution.md "GPU check"),
    # grouped's ~31 launches per module added ~530 us against masked's ~66 us, about 15 us a
    # launch, where masked's 32 x 480 x 1024 multiply-adds take well under 1 us. A launch is
    # weighed as 2**30 multiply-adds there (15 us at ~70 T multiply-adds/s), so grouped wins
    # only where masked's wasted rows cost billions of multiply-adds (few runs, long prompts).
    accelerator_launch_macs: int = 1 << 30
    # On a CPU with 16-bit weights (docs/modes.md, thirteenth pass; scripts/lora-strategy): each
    # matmul call in the dtype costs about 20 us whatever its size (oneDNN's per-call cost), four
    # launches; masked's wide matmuls over every token run at about twice float32's rate there
    # (AMX), so forcing masked beat grouped by 16-25 % on 80 %-one-adapter decode batches (the
    # divisor: StepShape.half_tiles only; a Zen 4 EPYC's AVX-512 bfloat16 ran masked's 68-token
    # merged prompt step 1.2x grouped's, docs/modes.md, twenty-second pass); and
    # grouped's float32 pass converts each short run's rows per step (about two reads an element).
    half_cpu_call_macs: int = 4 * 196608
    half_cpu_masked_divisor: int = 2
    float32_convert_macs: int = 32
    float32_pass_launches: int = 4  # the pass's gather, conversion, sum and copy back
    # On a CPU without native bfloat16 arithmetic (StepShape.half_emulated: x86 without
    # avx512_bf16 or amx_bf16; docs/modes.md, twentieth pass), a bfloat16 matmul's
    # multiply-adds each cost this many float32 ones, and masked gets no AMX rate (the divisor
    # above is not applied). Measured on a 2-core AVX2 EPYC Milan (small preset, bench modes'
    # decode steps of 16-32 sequences): masked took 3.5-5.3x the fastest strategy's step;
    # factors 4 to 32 all put those steps on grouped (mostly the float32 pass), 1 and 2 left
    # uniform batches on masked (scripts/lora-strategy/fit_emulated.py); 8 is mid-plateau.
    emulated_mac_factor: int = 8

    def __post_init__(self) -> None:
        for name in (
            "launch_macs",
            "read_macs",
            "half_cpu_read_factor",
            "accelerator_launch_macs",
            "half_cpu_call_macs",
            "float32_convert_macs",
            "float32_pass_launches",
            "emulated_mac_factor",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 0")
        if self.half_cpu_masked_divisor < 1:
            raise ValueError(
                f"half_cpu_masked_divisor {self.half_cpu_masked_divisor} is invalid; expected >= 1"
            )
        if self.min_runs_for_masked < 1:
            raise ValueError(
                f"min_runs_for_masked {self.min_runs_for_masked} is invalid; expected >= 1"
            )

    def masked(self, shape: StepShape, width: int) -> bool:
        """Whether a step of ``shape`` over modules ``width`` wide is cheaper masked than
        grouped."""
        if shape.runs < self.min_runs_for_masked:
            return False
        return self._masked_cost(shape, width) <= self._grouped_cost(shape, width)

    def choose(self, shape: StepShape, width: int) -> Strategy:
        """The cheapest strategy for ``shape`` (ties: masked, then batched, then grouped)."""
        if shape.runs < self.min_runs_for_masked:
            return Strategy.GROUPED
        grouped = self._grouped_cost(shape, width)
        if shape.float32_runs:
            grouped = min(grouped, self._float32_cost(shape, width))
        costs = [
            (self._masked_cost(shape, width), Strategy.MASKED),
            (grouped, Strategy.GROUPED),
        ]
        if shape.block_rows:
            costs.insert(1, (self._batched_cost(shape, width), Strategy.BATCHED))
        return min(costs, key=lambda cost: cost[0])[1]

    def grouped_in_float32(self, shape: StepShape, width: int) -> bool:
        """Whether a grouped step of ``shape`` is cheaper through the float32 pass (its short
        runs in float32, the others in the dtype) than all in the dtype."""
        if not shape.float32_runs:
            return False
        return self._float32_cost(shape, width) < self._grouped_cost(shape, width)

    # The launch terms count launches beyond masked's (its few fixed ops are the unit 0).
    def _masked_cost(self, shape: StepShape, width: int) -> int:
        cells = shape.num_tokens * shape.covered_rows
        work = (cells + self.read_macs * shape.covered_rows) * max(width, 1)
        if not shape.half_on_cpu:
            return work
        if shape.half_emulated:  # no AMX rate: every multiply-add at the emulated cost
            reads = self.read_macs * shape.covered_rows
            emulated = (self._dtype_macs(shape, cells) + reads) * max(width, 1)
            return emulated + 2 * self.half_cpu_call_macs
        divisor = self.half_cpu_masked_divisor if shape.half_tiles else 1
        return work // divisor + 2 * self.half_cpu_call_macs

    def _grouped_cost(self, shape: StepShape, width: int) -> int:
        reads = self._skinny_read_macs(shape) * shape.active_rows
        work = (self._dtype_macs(shape, shape.exact_cells) + reads) * max(width, 1)
        launch = self.accelerator_launch_macs if shape.on_accelerator else self.launch_macs
        return work + launch * (2 * shape.runs - 1) + self._half_calls(shape, 2 * shape.runs)

    def _float32_cost(self, shape: StepShape, width: int) -> int:
        """Grouped through the float32 pass: short runs at float32's read rate plus their rows'
        conversion, long runs as in the dtype, every adapter token gathered and copied back."""
        long_rows = shape.active_rows - shape.float32_rows
        long_cells = shape.exact_cells - shape.float32_cells
        short_reads = (self.read_macs + self.float32_convert_macs) * shape.float32_rows
        copies = 2 * self.read_macs * shape.adapter_tokens
        work = self._dtype_macs(shape, long_cells) + self._skinny_read_macs(shape) * long_rows
        work += shape.float32_cells + short_reads + copies
        launches = 2 * shape.runs - 1 + self.float32_pass_launches
        long_calls = self._half_calls(shape, 2 * (shape.runs - shape.float32_runs))
        return work * max(width, 1) + self.launch_macs * launches + long_calls

    def _dtype_macs(self, shape: StepShape, cells: int) -> int:
        """What ``cells`` multiply-adds in the weights' dtype cost, in float32 ones."""
        return cells * self.emulated_mac_factor if shape.half_emulated else cells

    def _half_calls(self, shape: StepShape, calls: int) -> int:
        """What ``calls`` matmul calls in the dtype add on a CPU with 16-bit weights."""
        return self.half_cpu_call_macs * calls if shape.half_on_cpu else 0

    def _batched_cost(self, shape: StepShape, width: int) -> int:
        reads = self._skinny_read_macs(shape) * shape.block_rows
        if not shape.block_groups:  # one grid: about as many launches as masked
            padded = self._dtype_macs(shape, shape.padded_cells)
            return (padded + reads) * max(width, 1) + self._half_calls(shape, 2)
        # per rank class: each token's row copied in and added back (a read each, per unit of
        # width: this is what keeps long prefill runs grouped), and per group a shrink, a scale
        # and an expand plus the gather and the scatter: launches beyond masked's four
        copies = self.read_macs * shape.gathered
        launch = self.accelerator_launch_macs if shape.on_accelerator else self.launch_macs
        work = (self._dtype_macs(shape, shape.padded_cells) + reads + copies) * max(width, 1)
        calls = self._half_calls(shape, 2 * shape.block_groups)
        return work + launch * (3 * shape.block_groups - 1) + calls

    def _skinny_read_macs(self, shape: StepShape) -> int:
        return self.read_macs * (self.half_cpu_read_factor if shape.half_on_cpu else 1)
