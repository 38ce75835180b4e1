"""The engine loop on its own thread: ``EngineThread`` runs ``EngineCore.step`` and the commands
event-loop threads hand it (submit, abort) between steps, so the scheduler and the KV cache are
only ever touched by that thread. ``AsyncEngine`` (``transport/thread_client.py``) drives one
in this process; the engine process's child (``transport/child_loop.py``) drives one there.

Torch-free at import time: it drives a core it is given (the builder imported torch).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from loraplex.errors import EngineUnavailableError

if TYPE_CHECKING:
    from loraplex.engine.core import EngineCore

_log = logging.getLogger(__name__)


class EngineThread:
    """Runs ``core.step`` in a loop; sleeps (woken early by commands and finished loads) when
    there is nothing to run. ``deliver`` runs after the commands and after each step: it hands
    what they sent to the requests' event loops."""

    def __init__(
        self, core: EngineCore, idle_wait_s: float, deliver: Callable[[], None] = lambda: None
    ) -> None:
        self.core = core
        self._idle_wait_s = idle_wait_s
        self._deliver = deliver
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.last_turn_s = time.monotonic()  # when the loop last turned (its progress)
        core.on_lease_done = self._wake.set
        self._thread = threading.Thread(target=self._loop, name="loraplex-engine", daemon=True)
        self._thread.start()

    def submit(self, command: Callable[[], None]) -> None:
        self._commands.put(command)
        self._wake.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._drain()
            self._deliver()
            try:
                worked = self.core.step()
            except Exception:  # an engine bug outside the forward: fail the live requests, go on
                _log.exception("engine step failed; aborting live requests")
                # NOTE: a fresh error, not the one raised: its text may come from one request's
                # values and must not reach every other tenant.
                self.core.abort_all(EngineUnavailableError("the engine step failed; retry"))
                worked = False
            self._deliver()
            self.last_turn_s = time.monotonic()
            if not worked:
                self._wake.wait(self._idle_wait_s)
                self._wake.clear()
        self._drain()
        self.core.close()
        self._deliver()

    def _drain(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            command()
