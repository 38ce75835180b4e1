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

The child is supervised. One IO thread reads its pipe; at EOF (the child died, however) every
live stream and call fails with ``EngineUnavailableError`` (503) naming the restart, the engine
reports itself down (``health()``: /ready answers 503, ``load_snapshot`` raises, new
requests are refused at once), and the same thread starts a new child after a bounded
exponential backoff (``restart.py``) until one is ready; then the engine is up again.
The child builds its tenant settings and warm policies from the registry, like the first one;
the pins, operator warm policies, merge holds and dedication the previous child had accepted are
replayed into it (``engine/standing.py``, ``process_replay.py``) before any request reaches it;
a hold released meanwhile, even while the engine was down, is not.

A child that lives but makes no progress (stopped, wedged) is caught by a watchdog
(``engine/watchdog.py``): the child beats from a liveness thread (a frozen process falls silent
within ``unresponsive_after_s``), its engine loop reports every step and a heartbeat (a wedged
loop stops within ``hung_after_s``), and the IO thread, which polls the pipe every ``tick``
rather than blocking on it, checks the gaps while work is pending. Hung, the engine refuses new
requests at once and reports itself not up (``health()`` names the hang); the requests that had
no output yet fail at once with the same 503 (they cannot be served soon; the child is told to
abort them when it recovers), and those already streaming wait for it (cutting them would turn a
delay into a failure). Alive and progressing again: it is up. Hung past the kill bound: the
child is killed and the restart path above takes over.
The child exits by itself when the parent goes away (its pipe reaches EOF).

With ``wait_ready=False`` the constructor returns as soon as the child is spawned (the engine is
down, "starting", until it is ready), so an HTTP server can answer liveness probes while the
model loads; ``wait_started()`` then waits for it. A failed first start is not retried: it is a
configuration error, raised by ``wait_started()``.

NOTE: over 300 lines on purpose: the client half (generate, calls) and the supervision half
(start, read, watch, restart, attach) share one lock and one up/down/hung state, and that
invariant is easier to check in one class than across two (the watchdog's arithmetic is apart,
in ``engine/watchdog.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from concurrent.futures import Future
from typing import Any

from loraplex.engine.protocol import EngineHealth, EngineLoad, EngineRequest, TokenDelta
from loraplex.engine.standing import StandingSettings
from loraplex.engine.tenant_shares import TenantSettings
from loraplex.engine.transport.messages import (
    AbortRequest,
    AddRequest,
    Alive,
    CacheCall,
    CacheCommand,
    Heartbeat,
    LoadDone,
    PauseRequest,
    Reply,
    StatePublish,
    StepOut,
    UpdateTenants,
)
from loraplex.engine.transport.process_inflight import InFlight
from loraplex.engine.transport.process_link import ChildLink
from loraplex.engine.transport.process_replay import send_unawaited
from loraplex.engine.transport.process_state import PublishedState
from loraplex.engine.transport.remote_cache import RemoteCache, RemoteMergeHolds
from loraplex.engine.transport.restart import Backoff, RestartPolicy
from loraplex.engine.transport.streams import Mailboxes, Outbox, outbox_stream
from loraplex.engine.transport.worker import WorkerHandles
from loraplex.engine.watchdog import Cause, ProgressWatchdog, Verdict, WatchdogPolicy
from loraplex.errors import EngineUnavailableError
from loraplex.model.tokenizer import TextTokenizer

_log = logging.getLogger(__name__)
_PROGRESS = (StepOut, StatePublish, Heartbeat)  # sent by the child's engine loop only
_MAX_TICK_S = 0.25  # the IO thread checks the watchdog at least this often


class EngineProcess:
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
        self._tokenizer = tokenizer
        policy = watchdog or WatchdogPolicy()
        intervals = (state_interval_s, policy.beat_interval_s, policy.alive_interval_s)
        self._build = functools.partial(_built, builder, args, intervals)
        self._preload = preload
        self._tick_s = min(_MAX_TICK_S, policy.hung_after_s / 4, policy.unresponsive_after_s / 4)
        self._watchdog = ProgressWatchdog(  # the IO thread's alone
            policy, time.monotonic(), judge_every_s=self._tick_s
        )
        self._start_timeout_s = start_timeout_s
        self._call_timeout_s = call_timeout_s
        self._backoff = Backoff(restart or RestartPolicy())
        self._closing = threading.Event()
        self._started = threading.Event()  # the first start ended (ready, or failed)
        self._start_error: BaseException | None = None  # why the first start failed
        self._lock = threading.Lock()  # the link, up/down; taken before the in-flight's
        self._inflight = InFlight()
        self._mailboxes = Mailboxes()
        self._state = PublishedState()  # what the child published (read without asking it)
        self._handlers: dict[type, Callable[[Any], None]] = {
            StepOut: self._inflight.on_step_out,
            Reply: self._inflight.on_reply,
            LoadDone: self._inflight.on_load_done,
            StatePublish: self._state.apply,
            Heartbeat: lambda beat: None,
            Alive: lambda beat: None,
        }
        self._max_loras = 0
        # why requests are refused; None: up
        self._down: EngineUnavailableError | None = EngineUnavailableError(
            "the engine process is starting; retry shortly"
        )
        # why requests are refused while the child lives but makes no progress; None: it does
        self._hung: EngineUnavailableError | None = None
        self._hung_aborts: list[str] = []  # aborts held back while hung (sent on recovery)
        self._hung_pauses: dict[str, bool] = {}  # pauses and resumes held back likewise
        self._num_restarts = 0
        # tenant settings not yet known to be applied by the child (see update_tenant_settings)
        self._tenants_unsent: dict[str, TenantSettings] | None = None
        # pins, warm policies, merge holds the child accepted: replayed into every restarted child
        self._standing = StandingSettings()
        # the child's adapter cache, for the admin API
        self.cache = RemoteCache(self.call, self.call_future, self._state)
        self.merge_holds = RemoteMergeHolds(self.call)  # the admin guard's (docs/modes.md)
        self._link = self._build(child if child is not None else ChildLink(preload))
        if wait_ready:
            self._first_start(self._link)
            self._start_error_raise()
        self._supervisor = threading.Thread(
            target=self._supervise,
            args=(self._link, not wait_ready),
            name="loraplex-engine-io",
            daemon=True,
        )
        self._supervisor.start()

    @property
    def tokenizer(self) -> TextTokenizer:
        return self._tokenizer

    @property
    def pid(self) -> int | None:
        """The current child's process id (the dead one's while a restart is pending)."""
        return self._link.pid

    @property
    def num_in_flight(self) -> int:
        """Streams and calls the current child owes an answer (sent, or queued to be)."""
        return self._inflight.num_pending

    @property
    def num_state_updates(self) -> int:
        """State publishes received so far (an idle child sends none: it publishes changes)."""
        return self._state.num_updates

    def wait_started(self, timeout_s: float | None = None) -> None:
        """Waits for the first start; raises why it failed (the child's own error), or
        EngineUnavailableError when it did not end within ``timeout_s``."""
        if not self._started.wait(timeout_s):
            raise EngineUnavailableError(f"the engine process did not start in {timeout_s} s")
        self._start_error_raise()

    def _start_error_raise(self) -> None:
        if self._start_error is not None:
            raise self._start_error

    def _first_start(self, link: ChildLink) -> bool:
        """Awaits the first child; False (and the error kept) when it failed."""
        try:
            max_loras = link.await_ready(self._start_timeout_s, self._closing)
        except BaseException as exc:
            self._start_error = exc
            with self._lock:
                self._down = EngineUnavailableError(
                    f"the engine process failed to start ({type(exc).__name__})"
                )
            self._started.set()
            return False
        with self._lock:
            self._max_loras = max_loras
            self._down = None
        self._watchdog.progress(time.monotonic())
        self._backoff.up(time.monotonic())
        self._started.set()
        return True

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

    # --- supervision --------------------------------------------------------------------------

    @staticmethod
    def _send(link: ChildLink, message: object) -> None:
        try:
            link.send(message)
        except (OSError, ValueError) as exc:
            raise EngineUnavailableError("the engine process is not running") from exc

    def _check_up(self) -> None:
        why = self._down or self._hung
        if why is not None:
            raise EngineUnavailableError(str(why))

    def _supervise(self, link: ChildLink | None, first_start: bool) -> None:
        """The IO thread: (starts the first child,) reads the child's pipe; when the child dies,
        fails what it had in flight and starts another one, until shutdown."""
        if first_start and link is not None and not self._first_start(link):
            return  # a configuration error: wait_started() raises it, nothing is retried
        while link is not None:
            self._read(link)
            link.close()
            if self._closing.is_set():
                self._fail_all(EngineUnavailableError("the engine process was shut down"))
                return
            how = link.describe_exit()
            if self._watchdog.hung:
                how = "was hung (no progress) and was killed"
            _log.error("engine process %s %s; restarting it", link.pid, how)
            self._fail_all(
                EngineUnavailableError(
                    f"the engine process {how}; it is being restarted, retry shortly"
                )
            )
            link = self._restart()

    def _read(self, link: ChildLink) -> None:
        watched_s = time.monotonic()
        while True:
            try:
                message = link.recv() if link.poll(self._tick_s) else None
            except (EOFError, OSError):
                return
            if message is not None:
                self._dispatch(message)
            now_s = time.monotonic()
            if now_s - watched_s >= self._tick_s:  # once per tick, however busy the pipe
                watched_s = now_s
                self._watch(link, now_s)

    def _dispatch(self, message: object) -> None:
        try:
            self._handlers[type(message)](message)
        except Exception:  # a malformed message must not kill the reader
            _log.exception("engine process message %s failed", type(message).__name__)
        if isinstance(message, _PROGRESS):
            self._watchdog.progress(time.monotonic())
        else:  # any message is a sign of life
            self._watchdog.alive(time.monotonic())

    def _watch(self, link: ChildLink, now_s: float) -> None:
        """The watchdog's verdict on the current child, acted on (see the module docstring)."""
        # Read /proc only once beats are missing (a few reads of tiny files per tick then).
        silent = self._watchdog.silence_s > 0 or self._watchdog.silent_s(now_s) >= self._tick_s
        runnable = silent and link.runnable()
        verdict = self._watchdog.check(now_s, self._inflight.num_pending > 0, runnable=runnable)
        if verdict is Verdict.KILL:  # the reader then sees EOF, and the restart path follows
            _log.error("engine process %s is still hung; killing it", link.pid)
            link.kill()
            return
        with self._lock:
            was_hung = self._hung is not None
            if verdict is Verdict.HUNG and not was_hung:
                self._hung = EngineUnavailableError(self._hang_reason(now_s))
                _log.error("engine process %s: %s", link.pid, self._hung)
                # NOTE: not yet begun, they cannot be served soon; streaming ones wait for it
                self._hung_aborts.extend(self._inflight.fail_unstarted(self._hung))
            elif verdict is Verdict.OK and was_hung:
                self._recover(link)

    def _hang_reason(self, now_s: float) -> str:
        if self._watchdog.cause is Cause.UNRESPONSIVE:
            silent_s = self._watchdog.silent_s(now_s)
            return (
                f"the engine process is hung: unresponsive (no sign of life) for {silent_s:.1f} s"
                " with work pending; retry shortly"
            )
        quiet_s = self._watchdog.quiet_s(now_s)
        return (
            f"the engine process is hung: no progress for {quiet_s:.1f} s with work pending;"
            " retry shortly"
        )

    def _recover(self, link: ChildLink) -> None:
        """The hung child gave what it lacked again, a sign of life or progress (called under the
        lock): it takes requests, and what was held back from it while hung reaches it now."""
        self._hung = None
        aborts, self._hung_aborts = self._hung_aborts, []
        _log.warning("engine process %s moves again; no longer hung", link.pid)
        for request_id in aborts:
            with contextlib.suppress(EngineUnavailableError):
                self._send(link, AbortRequest(request_id))
        pauses, self._hung_pauses = self._hung_pauses, {}
        for request_id, paused in pauses.items():
            with contextlib.suppress(EngineUnavailableError):
                self._send(link, PauseRequest(request_id, paused))
        self._send_unsent_tenants(link)

    def _restart(self) -> ChildLink | None:
        """Starts children, with backoff, until one is ready (returned) or shutdown (None)."""
        while not self._closing.wait(self._backoff.next_delay_s(time.monotonic())):
            with self._lock:
                self._num_restarts += 1
            try:
                link = self._build(ChildLink(self._preload))
                max_loras = link.await_ready(self._start_timeout_s, self._closing)
            except Exception as exc:  # its build failed, it died or timed out while starting
                _log.error("engine process restart failed", exc_info=exc)
                with self._lock:
                    self._down = EngineUnavailableError(
                        f"the engine process failed to start again ({type(exc).__name__}); "
                        "it is being restarted, retry later"
                    )
                continue
            if self._attach(link, max_loras):
                return link
            link.request_stop()
            link.close(self._call_timeout_s)
            return None
        return None

    def _attach(self, link: ChildLink, max_loras: int) -> bool:
        """Makes a ready child the current one (False: shutdown began, it is not wanted)."""
        with self._lock:
            if self._closing.is_set():
                return False
            self._send_unsent_tenants(link)  # before any request can reach the new child
            for command in self._standing.replay():  # what held before the restart holds again
                send_unawaited(link, self._inflight, command, type(command).__name__)
            self._link = link
            self._max_loras = max_loras
            self._down = None
            self._hung, self._hung_aborts, self._hung_pauses = None, [], {}
        self._watchdog.progress(time.monotonic())
        self._backoff.up(time.monotonic())
        _log.warning("engine process restarted (pid %s)", link.pid)
        return True

    def _send_unsent_tenants(self, link: ChildLink) -> None:
        """Tenant settings the child may not have, sent (under the lock) and not awaited."""
        if self._tenants_unsent is not None:
            command = UpdateTenants(self._tenants_unsent)
            send_unawaited(link, self._inflight, command, "tenant settings")

    def _fail_all(self, error: EngineUnavailableError) -> None:
        """The child is gone: the engine is down and everything it had in flight fails."""
        with self._lock:
            self._down = error
            self._state.clear()
        self._inflight.fail_all(error)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stops the child (live requests end with an error, its cache and registry close)
        and the supervision (no restart follows)."""
        with self._lock:
            self._closing.set()
            link = self._link
        link.request_stop()
        self._supervisor.join(timeout_s)
        if self._supervisor.is_alive():
            _log.warning("engine process did not stop in %s s; killing it", timeout_s)
            link.kill()
            self._supervisor.join(timeout_s)
        self._fail_all(EngineUnavailableError("the engine process was shut down"))


def _built(
    builder: Callable[..., WorkerHandles],
    args: tuple[Any, ...],
    intervals: tuple[float, float, float],
    link: ChildLink,
) -> ChildLink:
    """``link`` told to build ``builder(*args)``; killed and closed when that fails."""
    try:
        link.build(builder, args, intervals)
    except BaseException:
        link.kill()
        link.close()
        raise
    return link
