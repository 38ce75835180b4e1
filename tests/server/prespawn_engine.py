"""Builders for an engine child started ahead of its build (``ChildLink(preload)``): one that
builds the real engine side only if its preload was imported first, and one that reports whether
the child sees a mark the parent set before the child started (a fork does, a spawn does not).
Module-level, so a spawned child imports them."""

from __future__ import annotations

import sys
from pathlib import Path

from loraplex.engine.transport.worker import WorkerHandles
from loraplex.serve.config import ServeConfig

PRELOAD = "colorsys"  # a module nothing of loraplex imports: only the preload can have


def preloaded_worker(config: ServeConfig, model_dir: Path) -> WorkerHandles:
    if PRELOAD not in sys.modules:
        raise ValueError(f"preload {PRELOAD} is invalid; expected it imported before the build")
    from loraplex.serve.engine_side import build_worker

    return build_worker(config, model_dir)


def mark_worker(mark: str) -> WorkerHandles:
    import colorsys

    seen = getattr(colorsys, "loraplex_mark", None) == mark
    raise ValueError(f"mark seen: {seen}")  # how the child's view reaches the test


AHEAD_SEEN: list[str] = []  # what ``record_ahead`` saw, in the child


def record_ahead(mark: str) -> None:
    """An ``ahead`` call: records its mark and whether the preload was imported before it."""
    AHEAD_SEEN.append(f"{mark}, preload before: {PRELOAD in sys.modules}")


def failing_ahead(mark: str) -> None:
    raise ValueError(f"ahead {mark} is invalid; expected it to fail")


def ahead_worker() -> WorkerHandles:
    raise ValueError(f"ahead seen: {AHEAD_SEEN}, preload after: {PRELOAD in sys.modules}")
