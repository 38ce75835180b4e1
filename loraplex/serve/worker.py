"""The engine child's builder as the server process names it. ``EngineProcess`` pickles
``engine_worker`` by reference into its spawned child; there it imports the engine side (and
torch) and builds. This module imports neither, so the HTTP process never loads torch.

``loraplex serve`` starts the child first (``spawn_engine_child``), before it imports its HTTP
side or opens the registry: the child imports ``ENGINE_PRELOAD`` (torch alone takes a second or
more) while the parent does that, and builds once ``build_server`` tells it what to build.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from loraplex.artifacts.base_model import DigestedCheckpoint
from loraplex.engine.transport.process_link import ChildLink
from loraplex.serve.config import ServeConfig

if TYPE_CHECKING:
    from loraplex.engine.transport.worker import WorkerHandles

# What ``engine_worker`` imports: the engine side, with torch, the model and the adapter cache.
ENGINE_PRELOAD = ("loraplex.serve.engine_side",)


def engine_worker(
    config: ServeConfig, model_dir: Path, digested: DigestedCheckpoint | None = None
) -> WorkerHandles:
    """Everything the engine process runs (``engine_side.build_worker``), built in the child;
    ``digested``: the server's digest of the base model, reused while its files are unchanged."""
    from loraplex.serve.engine_side import build_worker
    from loraplex.serve.logs import configure_logging

    # a forked child has the server's handler already (replaced, not doubled); a spawned
    # restart has none
    configure_logging(config.log_level)
    return build_worker(config, model_dir, digested)


def engine_ahead(config: ServeConfig, model_dir: Path) -> None:
    """What the engine child starts before its ``Build`` (``ChildLink``'s ``ahead``), as
    ``build_worker`` begins: torch's threads and the heap's thresholds set, then the checkpoint's
    load on a thread (``engine.model_load.load_ahead``), which ``build_worker`` takes once the
    server's digest is known to cover it. Imports torch."""
    from loraplex.engine.model_load import load_ahead
    from loraplex.serve.engine_process import prepare_engine_process
    from loraplex.serve.engine_settings import engine_config

    prepare_engine_process(config)
    load_ahead(model_dir, engine_config(config))


def spawn_engine_child(config: ServeConfig | None = None) -> ChildLink:
    """An engine child importing ``ENGINE_PRELOAD`` from now on, not yet told what to build
    (``build_server(..., engine_child=...)`` does; kill and close it if that never happens).
    ``config``: the server's settings; when they name the model (``model``), the child starts
    loading it at once (``engine_ahead``), beside its imports and the server's start.

    On Linux, while this process runs no other thread, the child is forked: it starts within
    milliseconds with what the command line imported (the configuration, the registry), where a
    spawned interpreter would import them again first (and, under the ``loraplex`` script or
    ``python -m loraplex``, the whole command line with them: a second or more). A restarted
    child is spawned: by then the server runs threads, which a fork must not copy."""
    fork = sys.platform == "linux" and threading.active_count() == 1
    model_dir = None if config is None else config.model
    ahead = None if model_dir is None else (engine_ahead, (config, model_dir))
    return ChildLink(ENGINE_PRELOAD, fork=fork, ahead=ahead)
