"""The engine loop on its own thread, and ``AsyncEngine``: the EngineClient the server uses.

Commands from event-loop threads (submit, abort) go through a queue and run on the engine
thread between steps, so the scheduler and the KV cache are only ever touched by that thread.
Output travels back with ``loop.call_soon_threadsafe`` into one asyncio queue per request; the
event loop never blocks on the engine.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncGenerator, Callable

from loraplex.adapters.cache import TieredAdapterCache
from loraplex.adapters.identity import AdapterKey
from loraplex.adapters.tiering import Tier
from loraplex.engine.core import EngineCore
from loraplex.engine.protocol import EngineLoad, EngineRequest, TokenDelta
from loraplex.model.tokenizer import TextTokenizer

_log = logging.getLogger(__name__)


class EngineThread:
    """Runs ``core.step`` in a loop; sleeps (woken early by commands and finished loads) when
    there is nothing to run."""

    def __init__(self, core: EngineCore, idle_wait_s: float) -> None:
        self.core = core
        self._idle_wait_s = idle_wait_s
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
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

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._drain()
            try:
                worked = self.core.step()
            except Exception as exc:  # a model or engine bug: fail the live requests, go on
                _log.exception("engine step failed; aborting live requests")
                self.core.abort_all(exc)
                worked = False
            if not worked:
                self._wake.wait(self._idle_wait_s)
                self._wake.clear()
        self._drain()
        self.core.close()

    def _drain(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            command()


class AsyncEngine:
    """EngineClient over an EngineThread (see ``protocol.EngineClient``)."""

    def __init__(self, core: EngineCore, idle_wait_s: float, max_loras: int) -> None:
        self._core = core
        self._thread = EngineThread(core, idle_wait_s)
        self._max_loras = max_loras

    @property
    def tokenizer(self) -> TextTokenizer:
        return self._core.tokenizer

    @property
    def cache(self) -> TieredAdapterCache | None:
        return self._core.cache

    async def generate(self, request: EngineRequest) -> AsyncGenerator[TokenDelta, None]:
        loop = asyncio.get_running_loop()
        outbox: asyncio.Queue[TokenDelta | BaseException] = asyncio.Queue()

        def sink(item: TokenDelta | BaseException) -> None:
            loop.call_soon_threadsafe(outbox.put_nowait, item)

        def add() -> None:
            try:
                self._core.add(request, sink)
            except Exception as exc:  # queue full, prompt too long, duplicate id
                sink(exc)

        self._thread.submit(add)
        done = False
        try:
            while not done:
                item = await outbox.get()
                if isinstance(item, BaseException):
                    done = True
                    raise item
                done = item.finish_reason is not None
                yield item
        finally:
            if not done:
                self._thread.submit(lambda: self._core.abort(request.request_id))

    async def abort(self, request_id: str) -> None:
        self._thread.submit(lambda: self._core.abort(request_id))

    def load_snapshot(self) -> EngineLoad:
        view = self._core.view
        running: tuple[AdapterKey, ...] = ()
        if self._core.cache is not None:
            snapshot = self._core.cache.snapshot()
            running = tuple(e.key for e in snapshot.entries if e.tier is Tier.L0 and e.ready)
        resident = set(running)
        return EngineLoad(
            num_waiting=view.num_waiting,
            num_adapter_wait=view.num_adapter_wait,
            num_running=view.num_running,
            kv_usage=view.kv_usage,
            running_adapters=running,
            waiting_adapters=tuple(k for k in view.queued_adapters if k not in resident),
            max_loras=self._max_loras,
        )

    def shutdown(self) -> None:
        """Stop the loop; live requests end with an error and every lease is released.
        The adapter cache belongs to the caller (close it after this)."""
        self._thread.stop()
