"""The base model's checkpoint loaded on a thread of its own while the engine's start goes on
(its registry, adapter runtime and warm policies), so the two overlap.

Loading is reads from the page cache and the first writes of the weights' huge pages
(``model.buffers.weight_buffer``): on the large preset about a second of the engine's start,
most of it outside Python's lock.
"""

from __future__ import annotations

from pathlib import Path

from loraplex.background import Background
from loraplex.devices import torch_device
from loraplex.dtypes import torch_dtype
from loraplex.engine.config import EngineConfig
from loraplex.model.checkpoint import load_checkpoint
from loraplex.model.llama import LlamaModel


def load_in_background(model_dir: Path, config: EngineConfig) -> Background[LlamaModel]:
    """``load_checkpoint(model_dir)`` as ``config`` asks for it (device and dtype), started at
    once; its ``result()`` is the model, or raises what the load raised (a ValueError naming
    the device first, as ``build_engine_core`` raises)."""

    def load() -> LlamaModel:
        device = torch_device(config.device)
        return load_checkpoint(model_dir, dtype=torch_dtype(config.dtype), device=device)

    return Background(load, "loraplex-load")
