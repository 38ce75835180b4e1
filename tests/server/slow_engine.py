"""A builder for ``EngineProcess`` whose engine steps take ``step_s`` longer (a sleep after
each step that ran something; a sleep releases the interpreter lock as a torch operation does),
over the real engine side (``serve/engine_side.build_worker``): how the tests make a forward
longer than the liveness bound, and keep a stream running while its process is stopped.
Module-level, so the spawned child imports it."""

from __future__ import annotations

import time
from pathlib import Path

from loraplex.engine.transport.worker import WorkerHandles
from loraplex.serve.config import ServeConfig
from loraplex.serve.engine_side import build_worker


def slow_worker(step_s: float, config: ServeConfig, model_dir: Path) -> WorkerHandles:
    handles = build_worker(config, model_dir)
    core = handles.core
    step = core.step

    def slow_step() -> bool:
        worked = step()
        if worked:
            time.sleep(step_s)
        return worked

    core.step = slow_step  # type: ignore[method-assign]
    return handles
