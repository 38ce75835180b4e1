"""L2 -> L1: read a validated PEFT adapter directory into CPU tensors.

Only a :class:`~loraplex.adapters.validate.ValidatedAdapter` can be loaded: every name, shape,
dtype and byte range was checked before any memory is reserved here. Tensor bytes are read with
plain positioned reads straight into their final buffers (no lazy mapping, so a load's time is
the time to bring the bytes in; see WORKLOADS.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from loraplex.adapters.validate import AdapterTensor, ValidatedAdapter
from loraplex.errors import CorruptArtifactError

_TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


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
class AdapterWeights:
    """An adapter's tensors in host memory (tier L1), ready to be copied into a GPU slot."""

    digest: str  # sha256 of adapter_model.safetensors (the slot pool records it)
    dtype: torch.dtype  # dtype of every tensor
    modules: tuple[ModuleWeights, ...]  # ordered by layer, then module

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
    """Read every LoRA tensor of ``validated`` into CPU tensors of ``dtype``.

    ``pin_memory`` page-locks the buffers so a later host-to-device copy can be asynchronous
    (only meaningful when CUDA is present).
    """
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    with validated.weights_path.open("rb") as handle:
        for tensor in validated.tensors:
            raw = _read_tensor(handle.fileno(), tensor)
            value = raw.to(dtype)
            if pin_memory:
                value = value.pin_memory()
            pairs.setdefault((tensor.layer, tensor.module), {})[tensor.kind] = value
    modules = []
    for injected in validated.modules:
        pair = pairs.get((injected.layer, injected.module), {})
        if set(pair) != {"A", "B"}:
            raise CorruptArtifactError(
                f"{validated.weights_path}: layer {injected.layer} {injected.module} has "
                f"tensors {sorted(pair)}; expected lora_A and lora_B"
            )
        modules.append(
            ModuleWeights(injected.layer, injected.module, pair["A"], pair["B"], injected.scale)
        )
    return AdapterWeights(validated.digest, dtype, tuple(modules))


def _read_tensor(fd: int, tensor: AdapterTensor) -> torch.Tensor:
    """Read one tensor's bytes at its validated offset into a fresh buffer."""
    source_dtype = _TORCH_DTYPES[tensor.dtype]
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
