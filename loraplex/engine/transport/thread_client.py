"""``AsyncEngine``: the EngineClient over an engine loop on a thread of this process
(``engine_process = false``; a fleet's engine replica). Commands go to the loop's thread
(``loop.EngineThread``); output comes back through the mailboxes of ``streams.py``.

Torch-free at import time: it is handed a built core (``engine/factory.py`` builds one).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.loop import EngineThread
from loraplex.engine.protocol import EngineHealth, EngineLoad, EngineRequest, TokenDelta
from loraplex.engine.sched.stats import load_of
from loraplex.engine.transport.streams import Mailboxes, Outbox, outbox_stream
from loraplex.engine.watchdog import ProgressWatchdog, Verdict, WatchdogPolicy
from loraplex.errors import EngineUnavailableError
from loraplex.model.tokenizer import TextTokenizer
from loraplex.residency.ledger import Tier

if TYPE_CHECKING:
    from loraplex.engine.core import EngineCore
    from loraplex.residency.cache import TieredAdapterCache


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

    async def pause(self, request_id: str) -> None:
        self._thread.submit(lambda: self._core.pause(request_id))

    async def resume(self, request_id: str) -> None:
        self._thread.submit(lambda: self._core.resume(request_id))

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
