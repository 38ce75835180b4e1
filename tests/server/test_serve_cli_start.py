"""``loraplex serve`` listens while its engine process starts, and exits 1 when that first start
fails (a configuration error), instead of serving 503s forever."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from typing import Any, cast

import pytest

from loraplex.cli import serve as serve_cli
from loraplex.cli.serve_start import _stop_if_engine_fails
from loraplex.errors import EngineUnavailableError
from loraplex.serve.config import ServeConfig


class _Listener:
    should_exit = False


class _Starting:
    def __init__(self, error: Exception | None) -> None:
        self.error = error

    def wait_engine(self, timeout_s: float | None = None) -> None:
        if self.error is not None:
            raise self.error


@pytest.mark.parametrize(
    "error",
    [
        EngineUnavailableError("the engine process exited while starting"),
        ValueError("num_kv_blocks 1 x block_size 16 is invalid"),  # the child's own check
        RuntimeError("Expected one of cpu, cuda, ... device string: tpu"),  # torch's
    ],
)
def test_a_failed_first_engine_start_stops_the_listener(error: Exception) -> None:
    listener, failed = _Listener(), threading.Event()
    server = _Starting(error)
    _stop_if_engine_fails(cast(Any, server), cast(Any, listener), failed)
    assert failed.is_set() and listener.should_exit


def test_an_engine_that_starts_leaves_the_listener_serving() -> None:
    listener, failed = _Listener(), threading.Event()
    _stop_if_engine_fails(cast(Any, _Starting(None)), cast(Any, listener), failed)
    assert not failed.is_set() and not listener.should_exit


@pytest.fixture()
def _restore_gc() -> Iterator[None]:
    yield
    gc.unfreeze()
    gc.enable()


@pytest.mark.usefixtures("_restore_gc")
def test_start_runs_without_collections_until_its_objects_are_frozen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Start-up's collections (25-124 ms each in the front) free next to nothing: none runs
    until freeze_startup_objects, and collections are back on for serving."""
    seen: list[tuple[str, bool]] = []

    def start(settings: object) -> None:
        seen.append(("starting", gc.isenabled()))
        serve_cli.freeze_startup_objects()
        seen.append(("serving", gc.isenabled()))

    monkeypatch.setattr(serve_cli, "_start_and_serve", start)
    serve_cli._run(cast(ServeConfig, None))
    assert seen == [("starting", False), ("serving", True)]
    assert gc.get_freeze_count() > 0


@pytest.mark.usefixtures("_restore_gc")
def test_a_failed_start_leaves_collections_on(monkeypatch: pytest.MonkeyPatch) -> None:
    def start(settings: object) -> None:
        raise OSError("port in use")

    monkeypatch.setattr(serve_cli, "_start_and_serve", start)
    with pytest.raises(OSError, match="port in use"):
        serve_cli._run(cast(ServeConfig, None))
    assert gc.isenabled()
