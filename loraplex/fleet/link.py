"""``FleetLink``: the ingress's connection to the engine replicas and the board.

It owns a private event loop on its own thread, on which it polls the board every
``POLL_INTERVAL_S`` (the ingress's view of the replicas: ``entries()``) and runs calls that must
reach particular replicas (``call_each``: cache calls, tenant settings, release probes). Sync
callers (the admin routes run cache calls on the thread pool, the release controller on its
thread) get ``concurrent.futures.Future``s and never touch the HTTP server's loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from loraplex.engine.transport.messages import CacheCommand
from loraplex.errors import EngineUnavailableError
from loraplex.fleet.board import BoardEntry
from loraplex.fleet.left_replicas import LEFT_REPLICAS, LeftReplicas

_log = logging.getLogger(__name__)
POLL_INTERVAL_S = 0.5  # how often the ingress reads the board
CALL_TIMEOUT_S = 300.0  # a call to one replica (a pin waits for its load) gives up after this
T = TypeVar("T")


class ReplicaCalls(Protocol):
    """What the link needs of the deployments (Ray Serve handles in a fleet; fakes in tests)."""

    async def board_entries(self) -> list[BoardEntry]: ...

    async def cache_call(self, replica_id: str, command: CacheCommand) -> Any: ...


class FleetLink:
    """The board as last read, and calls to chosen replicas (see the module docstring)."""

    def __init__(
        self,
        calls: ReplicaCalls,
        poll_interval_s: float = POLL_INTERVAL_S,
        left: LeftReplicas = LEFT_REPLICAS,
    ) -> None:
        """``left``: the replicas this process's request router dropped (out of rotation here
        at once, before the board marks them stale)."""
        self._calls = calls
        self._left = left
        self._poll_interval_s = poll_interval_s
        self._entries: list[BoardEntry] = []
        self._polled = threading.Event()  # set once the board was read
        self._listeners: list[Callable[[list[BoardEntry]], None]] = []
        self._seen: set[str] = set()  # every replica id ever on the board
        self._departed: set[str] = set()
        self.num_departed = 0  # replicas that left the board (died, replaced, scaled down)
        self._loop = asyncio.new_event_loop()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="loraplex-fleet-link", daemon=True)
        self._thread.start()
        self._poller = self.submit(self._poll_forever())

    def entries(self) -> list[BoardEntry]:
        """Every replica on the board at the last poll; one the request router dropped since
        (``left``) is out of rotation at once, for every reader of this view."""
        return [replace(e, left=True) if e.replica_id in self._left else e for e in self._entries]

    def healthy_ids(self) -> list[str]:
        return [e.replica_id for e in self.entries() if e.healthy]

    def has_left(self, replica_id: str) -> bool:
        """Whether this process's request router dropped ``replica_id`` (it died or is
        stopping; ``left_replicas``)."""
        return replica_id in self._left

    def wait_polled(self, timeout_s: float) -> bool:
        """Whether the board has been read (within ``timeout_s``)."""
        return self._polled.wait(timeout_s)

    def on_entries(self, listener: Callable[[list[BoardEntry]], None]) -> None:
        """Calls ``listener`` (on the link's thread) after each poll."""
        self._listeners.append(listener)

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Runs ``coro`` on the link's loop; after ``close`` the future fails at once."""
        if self._stopping:
            coro.close()
            closed: Future[T] = Future()
            closed.set_exception(EngineUnavailableError("the fleet link is closed"))
            return closed
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def call(self, replica_id: str, command: CacheCommand) -> Future[Any]:
        """``command`` on one replica's cache."""
        return self.submit(self._call(replica_id, command))

    def call_each(
        self, command: CacheCommand, replica_ids: list[str] | None = None
    ) -> dict[str, Future[Any]]:
        """``command`` on each of ``replica_ids`` (default: every healthy replica)."""
        ids = self.healthy_ids() if replica_ids is None else replica_ids
        return {rid: self.call(rid, command) for rid in ids}

    def close(self) -> None:
        """Stops polling; calls still running are cancelled (their futures raise
        ``CancelledError``), so no caller waits for a loop that no longer runs."""
        if self._stopping:
            return
        self._stopping = True
        asyncio.run_coroutine_threadsafe(self._cancel_all(), self._loop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    async def _cancel_all(self) -> None:
        # NOTE: in a loop: a call submitted just before ``close`` may start while others end.
        while tasks := asyncio.all_tasks() - {asyncio.current_task()}:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        asyncio.get_running_loop().stop()

    async def _call(self, replica_id: str, command: CacheCommand) -> Any:
        return await asyncio.wait_for(self._calls.cache_call(replica_id, command), CALL_TIMEOUT_S)

    async def _poll_forever(self) -> None:
        while not self._stopping:
            try:
                self._entries = await asyncio.wait_for(self._calls.board_entries(), 10.0)
                current = {e.replica_id for e in self._entries}
                self.num_departed += len(self._seen - current - self._departed)
                self._departed |= self._seen - current
                self._seen |= current
                self._polled.set()
                for listener in self._listeners:
                    listener(self.entries())
            except Exception:  # the board restarting: keep the last view, try again
                _log.warning("fleet: reading the board failed", exc_info=True)
            await asyncio.sleep(self._poll_interval_s)
