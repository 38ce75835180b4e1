"""The cache's one lock, and the queue that keeps I/O and the slot lock out of it.

Torch-free. Bookkeeping runs under the lock; work that may block (an L2 ``rmtree``, an L0 slot
clear that waits for the engine's slot lock across a whole forward, a staged file's removal, a
phase handed to the executor) is queued with ``later`` while the lock is held and run after the
outermost holder has released it.

NOTE: queued work runs strictly in the order it was queued, by one thread at a time. A dropped
slot or key can be handed to a new load inside the same critical section; FIFO order makes the
drop (clear slot S, remove the L2 directory of K) finish before the new load's install into S
or K is submitted (a victim's slot handed to the load that evicted it is not dropped at all:
that install replaces it). A thread that finds another one draining leaves its work to that one and
returns at once, so no cache call ever waits for another call's I/O.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

_log = logging.getLogger(__name__)


class CacheLock:
    """A re-entrant lock whose queued work runs once the outermost ``with`` has released it."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0  # nesting of the current owner (changed only by the owner)
        self._queued: deque[Callable[[], None]] = deque()  # FIFO; appended under the lock
        self._draining = threading.Lock()  # held by the one thread running queued work

    def __enter__(self) -> CacheLock:
        self._lock.acquire()
        self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        outermost = self._depth == 0
        self._lock.release()
        if outermost:
            self.drain()

    def later(self, work: Callable[[], None]) -> None:
        """Queues ``work`` to run after the lock is released (call under the lock)."""
        self._queued.append(work)

    def drain(self) -> None:
        """Runs queued work unless another thread is already doing so (that one then runs what
        this thread queued: it re-checks the queue after letting go of the drain)."""
        while self._queued:
            if not self._draining.acquire(blocking=False):
                return
            try:
                while self._queued:
                    work = self._queued.popleft()
                    try:
                        work()
                    except Exception:
                        # One failed removal must not strand the drops and phases behind it.
                        _log.exception("adapter cache: queued work failed")
            finally:
                self._draining.release()
