"""Batched mixed-adapter LoRA ops, selected by name.

``get_backend("auto")`` is what the slot pool uses by default; ``reference`` is the PEFT-exact
loop the others are tested against. The registry raises on duplicate and unknown names.
"""

from __future__ import annotations

from collections.abc import Callable

from loraplex.ops.base import (
    ArenaLayout,
    LoraBackend,
    LoraBatch,
    ModuleLoraWeights,
    Segment,
    SlotRows,
    Strategy,
)
from loraplex.ops.policy import AutoPolicy
from loraplex.ops.reference import ReferenceBackend
from loraplex.ops.torch_ops import AutoBackend, BatchedBackend, GroupedBackend, MaskedBackend
from loraplex.ops.triton_ops import TritonBackend  # imports triton only when one is built

_REGISTRY: dict[str, Callable[[], LoraBackend]] = {}


def register_backend(name: str, factory: Callable[[], LoraBackend]) -> None:
    """Add a backend factory under ``name``; a name can be registered once."""
    if name in _REGISTRY:
        raise ValueError(f"backend {name!r} is already registered; expected a new name")
    _REGISTRY[name] = factory


def get_backend(name: str) -> LoraBackend:
    """A fresh backend instance registered under ``name``."""
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"backend {name!r} is unknown; expected one of {sorted(_REGISTRY)}")
    return factory()


def backend_names() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


register_backend("reference", ReferenceBackend)
register_backend("masked", MaskedBackend)
register_backend("grouped", GroupedBackend)
register_backend("batched", BatchedBackend)
register_backend("auto", AutoBackend)
register_backend("triton", TritonBackend)

__all__ = [
    "ArenaLayout",
    "AutoBackend",
    "AutoPolicy",
    "BatchedBackend",
    "GroupedBackend",
    "LoraBackend",
    "LoraBatch",
    "MaskedBackend",
    "ModuleLoraWeights",
    "ReferenceBackend",
    "Segment",
    "SlotRows",
    "Strategy",
    "backend_names",
    "get_backend",
    "register_backend",
]
