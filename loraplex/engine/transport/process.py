"""The engine in its own process: ``EngineProcess`` is the EngineClient the server uses by default.

Why a process: the HTTP layer (auth, resolution, JSON, per-token SSE) and the engine's Python
between torch calls both need the interpreter lock. On one process they take turns, and every
torch call the engine makes can wait up to a switch interval for the event loop to yield it.
A child process gives the engine its own interpreter (vLLM's V1 engine core runs apart from its
API server for the same reason).

The child is started with ``spawn`` (the first may be handed over already started, even
forked, see ``serve/worker.py``), imports the ``preload`` modules at once, and builds everything
that touches the model from a picklable ``builder`` (a module-level function and its arguments,
sent to it as ``Build``) returning ``WorkerHandles``:
the engine core, its adapter cache, and how to apply tenant settings and close. It then runs an
``EngineThread`` and answers one duplex pipe (``engine/transport/process_link.py``):

after every step one message carries all of that step's deltas, and the state the child publishes
when it changed (queue counts, residency as deltas, cache counters: ``process_state.py``)
answers ``load_snapshot``, ``RemoteCache.is_resident`` and ``RemoteCache.summary`` (/metrics)
without a round trip. Messages are typed (``messages.py``) and routed by their type.

Errors cross the pipe with their types and attributes (``packed_errors.py``).

One object in three layers, each file importing only the one below it: ``process_gate.ChildGate``
(the current child, whether requests may reach it, and the one lock over both),
``process_supervisor.ChildSupervisor`` (start, the IO thread, the watchdog's verdicts acted on,
restart, shutdown; its docstring says how the child is supervised) and ``EngineProcess`` here
(the EngineClient's calls: streams, aborts, pauses, snapshots, cache calls, tenant settings).
NOTE: layers of one object rather than separate objects: the client half and the supervision
half share one lock and one up/down/hung state, and that invariant is easier to check over one
object's fields, declared together in ``process_gate``.

With ``wait_ready=False`` the constructor returns as soon as the child is spawned (the engine is
down, "starting", until it is ready), so an HTTP server can answer liveness probes while the
model loads; ``wait_started()`` then waits for it. A failed first start is not retried: it is a
configuration error, raised by ``wait_started()``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Mapping
from concurrent.futures import Future
from typing import Any

from loraplex.engine.protocol import EngineHealth, EngineLoad, EngineRequest, TokenDelta
from loraplex.engine.tenant_shares import TenantSettings
from loraplex.engine.transport.messages import (
    AbortRequest,
    AddRequest,
    CacheCall,
    CacheCommand,
    PauseRequest,
    UpdateTenants,
)
from loraplex.engine.transport.process_link import ChildLink
from loraplex.engine.transport.process_supervisor import ChildSupervisor
from loraplex.engine.transport.remote_cache import RemoteCache, RemoteMergeHolds
from loraplex.engine.transport.restart import RestartPolicy
from loraplex.engine.transport.streams import Mailboxes, Outbox, outbox_stream
from loraplex.engine.transport.worker import WorkerHandles
from loraplex.engine.watchdog import WatchdogPolicy
from loraplex.errors import EngineUnavailableError
from loraplex.model.tokenizer import TextTokenizer


class EngineProcess(ChildSupervisor):
    """EngineClient over a supervised engine child process (see the module docstring)."""

    def __init__(
        self,
        builder: Callable[..., WorkerHandles],
        args: tuple[Any, ...],
        tokenizer: TextTokenizer,
        *,
        start_timeout_s: float = 600.0,
        call_timeout_s: float = 30.0,
        state_interval_s: float = 0.02,
        restart: RestartPolicy | None = None,
        wait_ready: bool = True,
        watchdog: WatchdogPolicy | None = None,
        preload: tuple[str, ...] = (),
        child: ChildLink | None = None,
    ) -> None:
        """``preload``: modules every child imports before it builds; ``child``: the first
        child, already spawned (``ChildLink(preload)``, not yet told what to build), which this
        client then owns."""
        super().__init__(
            builder,
            args,
            start_timeout_s=start_timeout_s,
            call_timeout_s=call_timeout_s,
            state_interval_s=state_interval_s,
            restart=restart,
            watchdog=watchdog,
            preload=preload,
        )
        self._tokenizer = tokenizer
        self._mailboxes = Mailboxes()
        # the child's adapter cache, for the admin API
        self.cache = RemoteCache(self.call, self.call_future, self._state)
        self.merge_holds = RemoteMergeHolds(self.call)  # the admin guard's (docs/modes.md)
        self._start(child, wait_ready)

    @property
    def tokenizer(self) -> TextTokenizer:
        return self._tokenizer

    # --- EngineClient ------------------------------------------------------------------------

    def generate(self, request: EngineRequest) -> AsyncGenerator[TokenDelta, None]:
        rid = request.request_id
        outbox: Outbox = asyncio.Queue()
        mailbox = self._mailboxes.of(asyncio.get_running_loop())

        def start() -> None:
            with self._lock:
                self._check_up()
                group = request.prefix_leader or rid  # its n siblings: one response
                self._inflight.add_stream(rid, mailbox, outbox, group)
                link = self._link  # NOTE: this child's, even if a restart follows at once
            self._send(link, AddRequest(request))

        def stop(finished: bool) -> None:
            if self._inflight.drop_stream(rid, outbox) and not finished:
                self._abort(rid)

        return outbox_stream(outbox, start, stop)

    async def abort(self, request_id: str) -> None:
        self._abort(request_id)

    def _abort(self, request_id: str) -> None:
        with self._lock:
            link = self._link if self._down is None else None
            if link is not None and self._hung is not None:
                # NOTE: a stopped child reads nothing: a send could block on a full pipe
                self._hung_aborts.append(request_id)
                return
        if link is not None:  # a dead child's requests are gone with it
            with contextlib.suppress(EngineUnavailableError):
                self._send(link, AbortRequest(request_id))

    async def pause(self, request_id: str) -> None:
        self._pause(request_id, True)

    async def resume(self, request_id: str) -> None:
        self._pause(request_id, False)

    def _pause(self, request_id: str, paused: bool) -> None:
        with self._lock:
            link = self._link if self._down is None else None
            if link is not None and self._hung is not None:
                # as for aborts: held back while hung, the latest per request sent on recovery
                self._hung_pauses[request_id] = paused
                return
        if link is not None:  # a dead child's requests are gone with it
            with contextlib.suppress(EngineUnavailableError):
                self._send(link, PauseRequest(request_id, paused))

    def load_snapshot(self) -> EngineLoad:
        with self._lock:
            self._check_up()
            max_loras = self._max_loras
        return self._state.load(max_loras)

    def health(self) -> EngineHealth:
        with self._lock:
            why = self._down or self._hung
            hung = self._down is None and self._hung is not None
            reason = None if why is None else str(why)
            starting = not self._started.is_set()  # set when the first start ended, either way
            return EngineHealth(
                why is None, self._num_restarts, reason, starting=starting, hung=hung
            )

    def update_tenant_settings(self, settings: Mapping[str, TenantSettings]) -> None:
        """Applies ``settings`` in the child. Recorded first: while the engine is down (or if
        the child dies meanwhile) the next child gets them when it comes up, since it may have
        read the registry before they changed."""
        unsent = dict(settings)
        with self._lock:
            self._tenants_unsent = unsent
            if self._down is not None or self._hung is not None:
                return
        self.call(UpdateTenants(unsent))
        with self._lock:
            if self._tenants_unsent is unsent:
                self._tenants_unsent = None

    # --- calls --------------------------------------------------------------------------------

    def call(self, command: CacheCommand) -> Any:
        """Runs ``command`` in the child and returns its result (or raises its error)."""
        return self._call(command, None)

    def call_future(self, command: CacheCommand) -> Future[None]:
        """A loading command (pin, prefetch): the future completes when its load does."""
        deferred: Future[None] = Future()
        self._call(command, deferred)
        return deferred

    def _call(self, command: CacheCommand, deferred: Future[None] | None) -> Any:
        with self._lock:
            # NOTE: under the lock the restart replays under: a release noted before the replay
            # is left out of it (and goes to the old child, or nowhere); one after reaches the new
            self._standing.withdraw(command)
            self._check_up()
            call_id, future = self._inflight.add_call(deferred)
            link = self._link
        answered = False
        try:
            self._send(link, CacheCall(call_id, command))
            result = future.result(self._call_timeout_s)
            answered = True
            self._standing.record(command)
            return result
        except TimeoutError as exc:
            raise EngineUnavailableError(
                f"the engine process did not answer {type(command).__name__} in "
                f"{self._call_timeout_s} s"
            ) from exc
        finally:
            self._inflight.end_call(call_id, answered)
