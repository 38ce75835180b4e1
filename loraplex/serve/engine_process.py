"""What an engine process sets before its first torch work, shared by its two starts: the
checkpoint's load ahead (``serve.worker.engine_ahead``, before the ``Build``) and the build itself
(``serve.engine_side.build_worker``). A module of its own so the load ahead starts after
importing torch and this, not the engine side's imports."""

from __future__ import annotations

from loraplex.engine.heap import keep_freed_heap
from loraplex.serve.config import ServeConfig


def prepare_engine_process(config: ServeConfig) -> None:
    """torch's threads (``torch_threads``) and the heap's thresholds (``engine.heap``); both
    idempotent, so ``build_worker`` sets them again after ``engine_ahead`` did."""
    import torch

    if config.torch_threads is not None:
        torch.set_num_threads(config.torch_threads)
    keep_freed_heap()
