"""The engine loop on its own thread, and ``AsyncEngine``: the EngineClient the server uses.

Commands from event-loop threads (submit, abort) go through a queue and run on the engine
thread between steps, so the scheduler and the KV cache are only ever touched by that thread.
Output travels back through one ``Mailbox`` per event loop into one asyncio queue per request:
the engine thread appends during a step and wakes each loop once after it, so the deltas of a
whole step cost one wakeup (one self-pipe write and one loop iteration), not one per request
(per-token wakeups were a tenth of the engine thread's time at 32 running requests). The event
loop never blocks on the engine.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Callable

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.core import EngineCore
from loraplex.engine.protocol import (
    EngineHealth,
    EngineLoad,
    EngineRequest,
    TokenDelta,
    merge_deltas,
)
from loraplex.engine.sched.stats import load_of
from loraplex.engine.watchdog import ProgressWatchdog, Verdict, WatchdogPolicy
from loraplex.errors import EngineUnavailableError
from loraplex.model.tokenizer import TextTokenizer
from loraplex.residency.cache import TieredAdapterCache
from loraplex.residency.ledger import Tier

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


def engine_load(
    core: EngineCore, max_loras: int, running: tuple[AdapterKey, ...] | None = None
) -> EngineLoad:
    """``core``'s load now: its published queue view and the adapters ready in L0 (``running``
    when the caller has just read them)."""
    view = core.view
    if running is None:
        running = () if core.cache is None else tuple(core.cache.residency(Tier.L0))
    return load_of(view, running, max_loras)


class AsyncEngine:
    """EngineClient over an EngineThread (see ``protocol.EngineClient``). A loop that stops
    turning while requests are live is hung (``engine/watchdog.py``): not up, new requests
    refused; there is nothing to kill on a thread (a fleet's replica is replaced by Ray Serve's
    health check instead)."""

    def __init__(
        self,
        core: EngineCore,
        idle_wait_s: float,
        max_loras: int,
        watchdog: WatchdogPolicy | None = None,
    ) -> None:
        self._core = core
        self._max_loras = max_loras
        self._mailboxes = Mailboxes()
        self._thread = EngineThread(core, idle_wait_s, self._mailboxes.wake_all)
        self._watch_lock = threading.Lock()
        self._watchdog = ProgressWatchdog(
            watchdog or WatchdogPolicy(), time.monotonic(), liveness=False
        )
        self._seen_turn_s = self._thread.last_turn_s
        self._num_live = 0  # streams started and not ended

    @property
    def tokenizer(self) -> TextTokenizer:
        return self._core.tokenizer

    @property
    def cache(self) -> TieredAdapterCache | None:
        return self._core.cache

    def generate(self, request: EngineRequest) -> AsyncGenerator[TokenDelta, None]:
        mailbox = self._mailboxes.of(asyncio.get_running_loop())
        outbox: Outbox = asyncio.Queue()

        def sink(item: TokenDelta | BaseException) -> None:
            mailbox.post(outbox, item)

        def add() -> None:
            try:
                self._core.add(request, sink)
            except Exception as exc:  # queue full, prompt too long, duplicate id
                sink(exc)

        live = False

        def start() -> None:
            nonlocal live
            hung = self._hung()
            if hung is not None:
                raise EngineUnavailableError(hung)
            with self._watch_lock:
                self._num_live += 1
            live = True
            self._thread.submit(add)

        def stop(finished: bool) -> None:
            if live:
                with self._watch_lock:
                    self._num_live -= 1
            if not finished:
                self._thread.submit(lambda: self._core.abort(request.request_id))

        return outbox_stream(outbox, start, stop)

    async def abort(self, request_id: str) -> None:
        self._thread.submit(lambda: self._core.abort(request_id))

    def load_snapshot(self) -> EngineLoad:
        return engine_load(self._core, self._max_loras)

    def health(self) -> EngineHealth:
        if not self._thread.is_alive():
            return EngineHealth(False, 0, "the engine thread stopped")
        hung = self._hung()
        return EngineHealth(hung is None, 0, hung, hung=hung is not None)

    def _hung(self) -> str | None:
        """Why the engine loop counts as hung now; None: it does not."""
        with self._watch_lock:
            now_s = time.monotonic()
            turn_s = self._thread.last_turn_s
            if turn_s != self._seen_turn_s:
                self._seen_turn_s = turn_s
                self._watchdog.progress(turn_s)
            if self._watchdog.check(now_s, self._num_live > 0) is Verdict.OK:
                return None
            quiet_s = self._watchdog.quiet_s(now_s)
        return (
            f"the engine is hung: no progress for {quiet_s:.1f} s with work pending; retry shortly"
        )

    def shutdown(self) -> None:
        """Stop the loop; live requests end with an error and every lease is released.
        The adapter cache belongs to the caller (close it after this)."""
        self._thread.stop()
