"""L2 -> L1: read a validated PEFT adapter directory into CPU tensors.

Only a :class:`~loraplex.artifacts.validate.ValidatedAdapter` can be loaded: every name, shape,
dtype and byte range was checked before any memory is reserved here. Tensor bytes are read with
plain positioned reads (no lazy mapping, so a load's time is the time to bring the bytes in; see
WORKLOADS.md) and copied into packed buffers: per target module, consecutive layers of equal rank
share one ``[num_layers, rank, d_in + d_out]`` buffer (:class:`ModuleRun`: each row an A row then
the matching B^T row), the slot pool's own layout, so an L1 -> L0 move is one plain copy per run.
Each :class:`ModuleWeights` is a view into its run.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from loraplex.artifacts.validate import AdapterTensor, InjectedModule, ValidatedAdapter
from loraplex.dtypes import torch_dtype
from loraplex.errors import CorruptArtifactError


@dataclass(frozen=True)
class ModuleWeights:
    """One injected linear layer's LoRA pair, in PEFT's orientation."""

    layer: int  # decoder layer index
    module: str  # target module name, e.g. "q_proj"
    lora_a: torch.Tensor  # [rank, d_in]
    lora_b: torch.Tensor  # [d_out, rank]
    scale: float  # PEFT scaling (alpha/r or alpha/sqrt(r), patterns resolved)

    @property
    def rank(self) -> int:
        return int(self.lora_a.shape[0])


@dataclass(frozen=True)
class ModuleRun:
    """One target module's pairs over consecutive layers of equal rank, stored packed."""

    module: str  # target module name
    first_layer: int  # decoder layer of rows[0]
    d_in: int  # columns of A; the remaining columns of each row are B^T
    rows: torch.Tensor  # [num_layers, rank, d_in + d_out]: per rank dim, A's row then B's column

    @property
    def num_layers(self) -> int:
        return int(self.rows.shape[0])

    @property
    def rank(self) -> int:
        return int(self.rows.shape[1])

    @property
    def lora_a(self) -> torch.Tensor:
        """[num_layers, rank, d_in] view."""
        return self.rows[..., : self.d_in]

    @property
    def lora_b_t(self) -> torch.Tensor:
        """[num_layers, rank, d_out] view (B transposed)."""
        return self.rows[..., self.d_in :]


@dataclass(frozen=True)
class AdapterWeights:
    """An adapter's tensors in host memory (tier L1), ready to be copied into a GPU slot."""

    digest: str  # sha256 of adapter_model.safetensors (the slot pool records it)
    dtype: torch.dtype  # dtype of every tensor
    modules: tuple[ModuleWeights, ...]  # ordered by layer, then module
    # The storage ``modules`` are views of (load_adapter_weights builds both); () = unpacked,
    # the pool then copies module by module.
    runs: tuple[ModuleRun, ...] = ()

    @property
    def num_bytes(self) -> int:
        """Bytes of tensor data held."""
        return sum(
            m.lora_a.numel() * m.lora_a.element_size() + m.lora_b.numel() * m.lora_b.element_size()
            for m in self.modules
        )

    @property
    def max_rank(self) -> int:
        return max((m.rank for m in self.modules), default=0)


def load_adapter_weights(
    validated: ValidatedAdapter, *, dtype: torch.dtype, pin_memory: bool = False
) -> AdapterWeights:
    """Read every LoRA tensor of ``validated`` into packed CPU tensors of ``dtype``.

    ``pin_memory`` page-locks the buffers so a later host-to-device copy can be asynchronous
    (only meaningful when CUDA is present).
    """
    runs: list[ModuleRun] = []
    place: dict[tuple[int, str], tuple[ModuleRun, int]] = {}
    for group in _runs_of(validated.modules):
        first = group[0]
        shape = (len(group), first.rank, first.d_in + first.d_out)
        rows = torch.empty(shape, dtype=dtype, pin_memory=pin_memory)
        run = ModuleRun(first.module, first.layer, first.d_in, rows)
        runs.append(run)
        place.update({(m.layer, m.module): (run, i) for i, m in enumerate(group)})
    filled: dict[tuple[int, str], set[str]] = {}
    with validated.weights_path.open("rb") as handle:
        for tensor in validated.tensors:
            run, i = place[(tensor.layer, tensor.module)]
            target = run.lora_a[i] if tensor.kind == "A" else run.lora_b_t[i].T
            target.copy_(_read_tensor(handle.fileno(), tensor))
            filled.setdefault((tensor.layer, tensor.module), set()).add(tensor.kind)
    modules = []
    for injected in validated.modules:
        if filled.get((injected.layer, injected.module)) != {"A", "B"}:
            raise CorruptArtifactError(
                f"{validated.weights_path}: layer {injected.layer} {injected.module} has "
                f"tensors {sorted(filled.get((injected.layer, injected.module), ()))}; "
                "expected lora_A and lora_B"
            )
        run, i = place[(injected.layer, injected.module)]
        modules.append(
            ModuleWeights(
                injected.layer, injected.module, run.lora_a[i], run.lora_b_t[i].T, injected.scale
            )
        )
    return AdapterWeights(validated.digest, dtype, tuple(modules), tuple(runs))


def _runs_of(modules: Sequence[InjectedModule]) -> list[list[InjectedModule]]:
    """Group injected modules per target module into runs of consecutive layers of one rank."""
    by_module: dict[str, list[InjectedModule]] = {}
    for injected in modules:
        by_module.setdefault(injected.module, []).append(injected)
    groups: list[list[InjectedModule]] = []
    for members in by_module.values():
        members.sort(key=lambda m: m.layer)
        for injected in members:
            last = groups[-1][-1] if groups else None
            if (
                last is not None
                and last.module == injected.module
                and last.layer + 1 == injected.layer
                and last.rank == injected.rank
            ):
                groups[-1].append(injected)
            else:
                groups.append([injected])
    return groups


def _read_tensor(fd: int, tensor: AdapterTensor) -> torch.Tensor:
    """Read one tensor's bytes at its validated offset into a fresh buffer."""
    source_dtype = torch_dtype(tensor.dtype)
    buffer = bytearray(tensor.num_bytes)
    view = memoryview(buffer)
    done = 0
    while done < tensor.num_bytes:
        count = os.preadv(fd, [view[done:]], tensor.file_offset + done)
        if count == 0:
            raise CorruptArtifactError(
                f"{tensor.name}: file ends after {done} of {tensor.num_bytes} bytes; "
                "expected the validated length"
            )
        done += count
    return torch.frombuffer(buffer, dtype=source_dtype).reshape(tensor.shape)
