"""A builder for ``EngineProcess`` that waits for a gate file before it builds the real engine
side (``serve/engine_side.build_worker``), or fails once the gate says so: how the tests see the
server while its engine process is still starting. Module-level, so the spawned child imports it."""

from __future__ import annotations

import time
from pathlib import Path

from loraplex.engine.transport.worker import WorkerHandles
from loraplex.serve.config import ServeConfig
from loraplex.serve.engine_side import build_worker

FAIL = "fail"  # gate file content that makes the build fail instead
_POLL_S = 0.05


def gated_worker(gate: Path, config: ServeConfig, model_dir: Path) -> WorkerHandles:
    while not gate.exists():
        time.sleep(_POLL_S)
    if gate.read_text() == FAIL:
        raise ValueError("model_dir is invalid; expected the gate to open")
    return build_worker(config, model_dir)
