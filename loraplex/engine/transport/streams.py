"""Output from an engine to the event loops: one ``Mailbox`` per event loop into one asyncio queue
(``Outbox``) per request. The engine side appends during a step and wakes each loop once after
it, so the deltas of a whole step cost one wakeup (one self-pipe write and one loop iteration),
not one per request (per-token wakeups were a tenth of the engine thread's time at 32 running
requests). The event loop never blocks on the engine. Both clients use these: ``AsyncEngine``
(an engine thread here) and ``EngineProcess`` (its IO thread reading the child's pipe).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import AsyncGenerator, Callable

from loraplex.engine.protocol import TokenDelta, merge_deltas

Outbox = asyncio.Queue[TokenDelta | BaseException]


class Mailbox:
    """Deliveries from the engine thread to one event loop, handed over in batches."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[Outbox, TokenDelta | BaseException]] = []
        self._scheduled = False  # a flush is queued on the loop and has not run yet

    def post(self, outbox: Outbox, item: TokenDelta | BaseException) -> None:
        """Queue ``item`` for ``outbox``; it reaches the loop at the next ``wake``."""
        with self._lock:
            self._items.append((outbox, item))

    def wake(self) -> None:
        """Schedule one flush on the loop if items wait and none is scheduled."""
        with self._lock:
            if self._scheduled or not self._items:
                return
            self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._flush)
        except RuntimeError:  # the loop is closed: nobody is left to read these
            with self._lock:
                self._items.clear()
                self._scheduled = False

    def _flush(self) -> None:
        with self._lock:
            items, self._items = self._items, []
            self._scheduled = False
        for outbox, item in items:
            outbox.put_nowait(item)


async def outbox_stream(
    outbox: Outbox, start: Callable[[], None], stop: Callable[[bool], None]
) -> AsyncGenerator[TokenDelta, None]:
    """Yields ``outbox``'s deltas until one finishes the request (an error item is raised).
    Deltas that queued up while the consumer was busy come out merged into one (a consumer
    that falls behind catches up with one SSE event, not one per token). ``start`` runs at the
    first iteration; ``stop(finished)`` runs however the stream ends (``finished`` False: the
    consumer left early, so the request must be aborted)."""
    finished = False
    pending: TokenDelta | BaseException | None = None
    try:
        start()
        while not finished:
            item = pending if pending is not None else await outbox.get()
            pending = None
            if isinstance(item, BaseException):
                finished = True
                raise item
            while item.finish_reason is None and not outbox.empty():
                following = outbox.get_nowait()
                if isinstance(following, BaseException):
                    pending = following
                    break
                item = merge_deltas(item, following)
            finished = item.finish_reason is not None
            yield item
    finally:
        stop(finished)


class Mailboxes:
    """One Mailbox per event loop, made on first use (the loops' threads add, the engine's
    delivery reads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._boxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Mailbox] = (
            weakref.WeakKeyDictionary()
        )

    def of(self, loop: asyncio.AbstractEventLoop) -> Mailbox:
        with self._lock:
            mailbox = self._boxes.get(loop)
            if mailbox is None:
                mailbox = self._boxes[loop] = Mailbox(loop)
            return mailbox

    def wake_all(self) -> None:
        with self._lock:
            mailboxes = list(self._boxes.values())
        for mailbox in mailboxes:
            mailbox.wake()
