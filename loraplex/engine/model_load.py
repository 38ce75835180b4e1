"""The base model's checkpoint loaded on a thread of its own while the engine's start goes on
(its registry, adapter runtime and warm policies), so the two overlap.

Loading is reads from the page cache and the first writes of the weights' huge pages
(``model.buffers.weight_buffer``): on the large preset about a second of the engine's start,
most of it outside Python's lock.

With packed weights (``model.layers.PackedLinear``: float32 on a CPU) the load leaves the
packing to one more thread, started as the load returns (``pack_in_background``): about half a
second of CPU on the large preset that would otherwise delay the first answer; the first steps
run oneDNN on the dense weights meanwhile, with the same results.
"""

from __future__ import annotations

import logging
from pathlib import Path

from loraplex.background import Background
from loraplex.devices import torch_device
from loraplex.dtypes import torch_dtype
from loraplex.engine.config import EngineConfig
from loraplex.model.checkpoint import load_checkpoint
from loraplex.model.llama import LlamaModel

_log = logging.getLogger(__name__)


def load_in_background(model_dir: Path, config: EngineConfig) -> Background[LlamaModel]:
    """``load_checkpoint(model_dir)`` as ``config`` asks for it (device, dtype and
    ``base_linear_kernel``), started at
    once; its ``result()`` is the model, or raises what the load raised (a ValueError naming
    the device first, as ``build_engine_core`` raises)."""

    def load() -> LlamaModel:
        device = torch_device(config.device)
        dtype = torch_dtype(config.dtype)
        kernel = config.base_linear_kernel
        model = load_checkpoint(
            model_dir, dtype=dtype, device=device, linear_kernel=kernel, prepack=False
        )
        pack_in_background(model)
        return model

    return Background(load, "loraplex-load")


def pack_in_background(model: LlamaModel) -> Background[int]:
    """``model.prepack()`` on a thread of its own, then the weights' memory logged
    (``log_weight_memory``); a failure is logged (the layers keep running the dense weights:
    slower, same results)."""

    def pack() -> int:
        try:
            packed = model.prepack()
        except Exception:
            _log.warning("packing the base weights failed; the dense weights run", exc_info=True)
            raise
        log_weight_memory(model)
        return packed

    return Background(pack, "loraplex-pack")


def log_weight_memory(model: LlamaModel) -> None:
    """One line at start with the base weights' bytes: the dense weights' and, with the
    "packed" kernel, the packed copies' held beside them (``base_linear_kernel``)."""
    _log.info(
        "base model weights: %d bytes dense, %d bytes of packed copies beside them "
        "(linear kernel %s)",
        model.weight_bytes(),
        model.packed_bytes(),
        model.linear_kernel,
    )
