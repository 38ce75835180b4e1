"""What the engine child sends the parent, written to the pipe by a thread of its own.

Why a thread: the engine loop sends each step's output (``StepOut``) and now and then its state
between two steps. Pickling a step's deltas and writing them cost the loop 0.5-1 ms a step in a
real server on two cores (the write wakes the parent's reader, and the writer often waits for
the CPU it handed over), about a tenth of a decode step of the small model. Queued instead, the
pickling and the write overlap the next forward (torch releases the interpreter lock inside its
operations), and the loop goes on at once. Nothing waits longer: the writer sends each message
as soon as it runs, in the order queued.

The queue is bounded, so a parent that stops reading still stalls the loop (as a full pipe did)
instead of letting output pile up without end. Once the pipe broke (the parent is gone), the
writer drops what is queued, so a sender never blocks on a dead pipe; ``send`` after ``close``
raises ``ValueError``, as a closed ``Connection`` does.
"""

from __future__ import annotations

import queue
import threading
from multiprocessing.connection import Connection

# Messages queued at most: far more than a few steps' worth (one StepOut a step, a state publish
# at most every state interval), so only a parent that stopped reading ever fills it.
MAX_QUEUED = 256

_CLOSE = object()  # ends the writer thread


class ChildOutbox:
    """Sends ``conn`` every message given to ``send``, in order, from its own thread."""

    def __init__(self, conn: Connection, max_queued: int = MAX_QUEUED) -> None:
        self._conn = conn
        self._queue: queue.Queue[object] = queue.Queue(max_queued)
        self._closed = False
        self.broken: BaseException | None = None  # why a write failed (the parent is gone)
        self._thread = threading.Thread(
            target=self._write_loop, name="loraplex-engine-outbox", daemon=True
        )
        self._thread.start()

    def send(self, message: object) -> None:
        """Queues ``message``; blocks only while ``max_queued`` messages wait (a parent that
        does not read). ValueError once closed."""
        if self._closed:
            raise ValueError("the engine child's outbox is closed")
        self._queue.put(message)

    def close(self, timeout_s: float) -> None:
        """Sends what is queued, then stops the writer (waiting up to ``timeout_s``)."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_CLOSE)
        self._thread.join(timeout_s)

    def _write_loop(self) -> None:
        while (message := self._queue.get()) is not _CLOSE:
            if self.broken is not None:
                continue  # NOTE: drained, not kept: a sender must never block on a dead pipe
            try:
                self._conn.send(message)
            except (OSError, ValueError) as exc:  # the parent is gone; run() sees EOF and stops
                self.broken = exc
