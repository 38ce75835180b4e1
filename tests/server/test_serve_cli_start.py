"""``loraplex serve`` listens while its engine process starts, and exits 1 when that first start
fails (a configuration error), instead of serving 503s forever."""

from __future__ import annotations

import threading
from typing import Any, cast

import pytest

from loraplex.cli.serve import _stop_if_engine_fails
from loraplex.errors import EngineUnavailableError


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
