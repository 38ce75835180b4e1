"""One call run on a thread of its own from the moment it is made, its result taken later.

What a start-up overlaps with its other work: the engine process's checkpoint load
(``engine.model_load``) and the server's digest of the base model (``loraplex serve``), both
file reads and work that leaves Python's lock to other threads (a copy into memory,
``hashlib`` over large blocks), so on a second core they cost the start only what outlasts
the work beside them. Torch-free.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Background(Generic[T]):
    """``call()`` started at once on a daemon thread named ``name``; ``result()`` waits for it
    and returns its value or raises what it raised."""

    def __init__(self, call: Callable[[], T], name: str) -> None:
        self._value: T | None = None
        self._error: BaseException | None = None
        self._done = False
        self._thread = threading.Thread(target=self._run, args=(call,), name=name, daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], T]) -> None:
        try:
            self._value = call()
        except BaseException as exc:  # handed to the caller by result()
            self._error = exc
        self._done = True

    def wait(self) -> None:
        """Until the call has ended, however it ended (a start failing elsewhere waits here
        before it reports, so no such work runs on behind its error)."""
        self._thread.join()

    def result(self) -> T:
        self.wait()
        if self._error is not None:
            raise self._error
        if not self._done:  # unreachable: the thread ends by setting one of the two
            raise RuntimeError("the background call ended without a value or an error")
        return self._value  # type: ignore[return-value]  # T itself may include None
