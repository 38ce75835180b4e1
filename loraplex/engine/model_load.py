"""The base model's checkpoint loaded on a thread of its own while the engine's start goes on
(its registry, adapter runtime and warm policies), so the two overlap.

Loading is reads from the page cache and the first writes of the weights' huge pages
(``model.buffers.weight_buffer``): on the large preset about a second of the engine's start,
most of it outside Python's lock.

With packed weights (``model.layers.PackedLinear``: float32 on a CPU) the load leaves the
packing to one more thread, started as the load returns (``pack_in_background``): about half a
second of CPU on the large preset that would otherwise delay the first answer; the first steps
run oneDNN on the dense weights meanwhile, with the same results.

``loraplex serve`` with a configured model names it to its engine process at the fork
(``load_ahead``, ``serve.worker.engine_ahead``): the load starts as soon as torch is imported,
beside the rest of the process's imports and the server's own start, instead of after the
server's ``Build``. The build takes that load (``load_in_background``) only when it is of the
same directory and settings and the checkpoint's files stat, before and after the read, as they
did for the server's digest (``DigestedCheckpoint.covers``); otherwise it loads again, and
that load too must read the files the digest is of (else the engine's start fails).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from loraplex.artifacts.base_model import DigestedCheckpoint, ReadStamps, read_stamps
from loraplex.background import Background
from loraplex.devices import torch_device
from loraplex.dtypes import torch_dtype
from loraplex.engine.config import EngineConfig
from loraplex.errors import CheckpointError
from loraplex.model.checkpoint import load_checkpoint
from loraplex.model.llama import LlamaModel

_log = logging.getLogger(__name__)


def load_in_background(
    model_dir: Path, config: EngineConfig, digested: DigestedCheckpoint | None = None
) -> Background[LlamaModel]:
    """``load_checkpoint(model_dir)`` as ``config`` asks for it (device, dtype and
    ``base_linear_kernel``), started at once; its ``result()`` is the model, or raises what the
    load raised (a ValueError naming the device first, as ``build_engine_core`` raises).

    A load this process started ahead (``load_ahead``) of the same directory and settings is
    taken instead, once its files are known to be the ones ``digested`` read
    (``DigestedCheckpoint.covers``); a load ahead that does not pass (another directory or
    settings, no ``digested``, a file changed, or its load failed) is dropped and the
    checkpoint loaded again, here."""
    ahead = _take_ahead(model_dir, config)
    if ahead is None:
        return Background(lambda: _load_digested(model_dir, config, digested), "loraplex-load")

    def checked() -> LlamaModel:
        model = ahead.model_if_covered(digested)
        if model is not None:
            return model
        _log.info("the checkpoint loaded ahead is not the one digested; loading it again")
        return _load_digested(model_dir, config, digested)

    return Background(checked, "loraplex-load")


def _load_digested(
    model_dir: Path, config: EngineConfig, digested: DigestedCheckpoint | None
) -> LlamaModel:
    """``_load``, and with ``digested`` a CheckpointError unless its files stat, before and
    after the read, as they did for that digest (``DigestedCheckpoint.covers``). NOTE: only a
    load ahead was checked: this load read whatever the files held by then, so a base file
    replaced after the server's digest was served under the old digest (attack26)."""
    if digested is None:
        return _load(model_dir, config)
    model, stamps = read_stamps(model_dir, lambda: _load(model_dir, config))
    if not digested.covers(stamps):
        raise CheckpointError(
            f"{model_dir}: the base model's files changed after they were digested (or while "
            "they were read); expected the files the digest is of: start the server again to "
            "digest them anew"
        )
    return model


def load_ahead(model_dir: Path, config: EngineConfig) -> None:
    """Starts loading ``model_dir`` for ``config`` on a thread now, for this process's
    ``load_in_background`` to take (see the module docstring); once per process."""
    if _AHEAD:
        raise ValueError("a checkpoint load was already started ahead in this process")
    _AHEAD.append(_Ahead(model_dir, _load_settings(config), Background(
        lambda: read_stamps(model_dir, lambda: _load(model_dir, config)), "loraplex-load-ahead"
    )))  # fmt: skip


@dataclass(frozen=True)
class _Ahead:
    model_dir: Path
    settings: tuple[str, str, str]  # _load_settings
    loading: Background[tuple[LlamaModel, ReadStamps]]

    def model_if_covered(self, digested: DigestedCheckpoint | None) -> LlamaModel | None:
        """The model loaded ahead when ``digested`` covers its read; None otherwise (a failed
        load too: the load again raises its own error)."""
        try:
            model, stamps = self.loading.result()
        except Exception:  # NOTE: not ignored: the caller loads again, which raises it anew
            _log.info("the checkpoint load ahead failed; loading it again", exc_info=True)
            return None
        return model if digested is not None and digested.covers(stamps) else None


_AHEAD: list[_Ahead] = []  # load_ahead's (one at most), until load_in_background takes it


def _take_ahead(model_dir: Path, config: EngineConfig) -> _Ahead | None:
    if not _AHEAD:
        return None
    ahead = _AHEAD.pop()
    if ahead.model_dir != model_dir or ahead.settings != _load_settings(config):
        _log.info("the checkpoint loaded ahead is of other settings; loading it again")
        return None
    return ahead


def _load_settings(config: EngineConfig) -> tuple[str, str, str]:
    """What of ``config`` a load depends on."""
    return (str(config.device), str(config.dtype), str(config.base_linear_kernel))


def _load(model_dir: Path, config: EngineConfig) -> LlamaModel:
    device = torch_device(config.device)
    dtype = torch_dtype(config.dtype)
    kernel = config.base_linear_kernel
    model = load_checkpoint(
        model_dir, dtype=dtype, device=device, linear_kernel=kernel, prepack=False
    )
    pack_in_background(model)
    return model


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
