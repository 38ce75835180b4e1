"""The engine child's builder as the server process names it. ``EngineProcess`` pickles
``engine_worker`` by reference into its spawned child; there it imports the engine side (and
torch) and builds. This module imports neither, so the HTTP process never loads torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from loraplex.serve.config import ServeConfig

if TYPE_CHECKING:
    from loraplex.engine.transport.worker import WorkerHandles


def engine_worker(config: ServeConfig, model_dir: Path) -> WorkerHandles:
    """Everything the engine process runs (``engine_side.build_worker``), built in the child."""
    from loraplex.serve.engine_side import build_worker

    return build_worker(config, model_dir)
