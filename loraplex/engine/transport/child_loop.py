"""The engine process's message loop (``ChildLoop``): the parent's messages in, the engine's
batched output, state publishes and heartbeats out, and a liveness thread beating whatever the
engine loop does. ``process_child.py`` builds the engine and runs it; ``messages.py`` lists the
messages; errors cross as ``packed_errors.PackedError``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any

from loraplex.engine.loop import EngineThread
from loraplex.engine.protocol import EngineRequest, TokenDelta
from loraplex.engine.sched.stats import QueueView
from loraplex.engine.transport.cache_commands import run_cache_command, run_hold_command
from loraplex.engine.transport.child_outbox import ChildOutbox
from loraplex.engine.transport.messages import (
    AbortRequest,
    AddRequest,
    Alive,
    CacheCall,
    CacheCommand,
    Dedicate,
    Heartbeat,
    HoldMerges,
    LoadDone,
    PauseRequest,
    Reply,
    StatePublish,
    StepOut,
    Stop,
    UpdateTenants,
)
from loraplex.engine.transport.packed_errors import PackedError, pack_error
from loraplex.engine.transport.worker import WorkerHandles
from loraplex.errors import EngineUnavailableError
from loraplex.residency.cache import CacheSummary, TieredAdapterCache

# How long a stopping child waits for its outbox to reach the parent before it closes the pipe.
_FLUSH_TIMEOUT_S = 10.0


class _Published:
    """What the parent was last told, so a publish carries only what changed since."""

    def __init__(self) -> None:
        self.queue: QueueView | None = None  # the last queue view sent
        self.residency_version: int | None = None  # None: nothing sent (the first is full)
        self.summary: CacheSummary | None = None  # the last cache summary sent
        self.at_s = float("-inf")  # when changes were last looked for
        self.sent_s = float("-inf")  # when the engine loop last sent anything (progress)


class _Liveness:
    """A thread of its own that sends ``Alive`` every ``interval_s`` whatever the engine loop
    does: torch releases the interpreter lock inside its operations, so it beats during a long
    forward too, and only a frozen process (stopped, a stalled VM) falls silent."""

    def __init__(self, send: Callable[[object], None], interval_s: float) -> None:
        self._send = send
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loraplex-engine-alive", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(self._interval_s + 1.0)

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            try:
                self._send(Alive())
            except (OSError, ValueError):  # the parent is gone; run() sees EOF and stops
                return


class ChildLoop:
    """The child's side of the pipe: messages in, batched output and state out."""

    def __init__(
        self, conn: Connection, handles: WorkerHandles, intervals: tuple[float, float, float]
    ) -> None:
        self._conn = conn
        self._handles = handles
        self._core = handles.core
        self._cache: TieredAdapterCache | None = handles.core.cache
        self._outbox = ChildOutbox(conn)  # NOTE: before the engine thread can deliver anything
        self._out_lock = threading.Lock()
        self._out: list[tuple[str, TokenDelta | PackedError]] = []
        self._state_interval_s, self._beat_interval_s, alive_interval_s = intervals
        self._liveness = _Liveness(self.send, alive_interval_s)
        self._published = _Published()
        self._handlers: dict[type, Callable[[Any], None]] = {
            AddRequest: self._on_add,
            AbortRequest: self._on_abort,
            PauseRequest: self._on_pause,
            CacheCall: self._on_call,
        }
        self._thread = EngineThread(handles.core, handles.idle_wait_s, self._deliver)

    def send(self, message: object) -> None:
        """Queues ``message`` for the parent (``child_outbox``: the writer thread sends it)."""
        self._outbox.send(message)

    def run(self) -> None:
        """Answers messages until ``Stop`` or until the parent is gone."""
        self._liveness.start()
        try:
            while True:
                try:
                    message = self._conn.recv()
                except (EOFError, OSError):
                    return
                if isinstance(message, Stop):
                    return
                self._handlers[type(message)](message)
        finally:
            self._liveness.stop()
            self._thread.stop()
            self._handles.close()
            self._outbox.close(_FLUSH_TIMEOUT_S)  # the loop's last output reaches the parent

    def _on_add(self, message: AddRequest) -> None:
        request = message.request
        self._thread.submit(lambda: self._add(request))

    def _on_abort(self, message: AbortRequest) -> None:
        request_id = message.request_id
        self._thread.submit(lambda: self._core.abort(request_id))

    def _on_pause(self, message: PauseRequest) -> None:
        request_id, core = message.request_id, self._core
        act = core.pause if message.paused else core.resume
        self._thread.submit(lambda: act(request_id))

    def _add(self, request: EngineRequest) -> None:
        rid = request.request_id

        def sink(item: TokenDelta | BaseException) -> None:
            packed = pack_error(item) if isinstance(item, BaseException) else item
            with self._out_lock:
                self._out.append((rid, packed))

        try:
            self._core.add(request, sink)
        except Exception as exc:  # queue full, prompt too long, duplicate id
            sink(exc)

    def _on_call(self, call: CacheCall) -> None:
        try:
            value = self._run(call.command)
        except Exception as exc:
            self.send(Reply(call.call_id, False, pack_error(exc)))
            return
        if call.command.loads:
            future: Future[None] = value
            self.send(Reply(call.call_id, True, future.done()))
            future.add_done_callback(lambda f: self._done(call.call_id, f))
        else:
            self.send(Reply(call.call_id, True, value))

    def _run(self, command: CacheCommand) -> Any:
        if isinstance(command, UpdateTenants):
            self._handles.update_tenants(command.settings)
            return None
        if isinstance(command, HoldMerges | Dedicate):
            return run_hold_command(self._handles.merge_holds, command)
        if self._cache is None:
            raise EngineUnavailableError("this engine has no adapter cache")
        return run_cache_command(self._cache, command)

    def _done(self, call_id: int, future: Future[None]) -> None:
        error = None if future.cancelled() else future.exception()
        with contextlib.suppress(OSError, ValueError):  # the parent may be gone
            self.send(LoadDone(call_id, None if error is None else pack_error(error)))

    def _deliver(self) -> None:
        """Runs on the engine thread after the commands and after each step."""
        with self._out_lock:
            out, self._out = self._out, []
        published = self._published
        try:
            now = time.monotonic()
            sent = bool(out)
            if out:
                self.send(StepOut(out))
            if now - published.at_s >= self._state_interval_s:
                published.at_s = now
                changes = self._changes()
                if changes is not None:
                    self.send(changes)
                    sent = True
            if sent:
                published.sent_s = now
            elif now - published.sent_s >= self._beat_interval_s:
                published.sent_s = now
                self.send(Heartbeat())  # NOTE: idle too, so the parent sees the loop turn
        except (OSError, ValueError):  # the parent is gone; run() sees EOF and stops
            pass

    def _changes(self) -> StatePublish | None:
        """What changed since the last publish (None: nothing). Costs what changed, not what is
        cached: residency comes as the cache's deltas, the rest as a few counters."""
        published = self._published
        queue = self._core.view
        queue_changed = queue != published.queue
        residency = summary = None
        if self._cache is not None:
            since = published.residency_version
            residency = self._cache.residency_changes(0 if since is None else since)
            if residency.version == since:  # nothing changed (not even when the answer is full)
                residency = None
            summary = self._cache.summary()
            if summary == published.summary:
                summary = None
        if not queue_changed and residency is None and summary is None:
            return None
        published.queue = queue
        if residency is not None:
            published.residency_version = residency.version
        if summary is not None:
            published.summary = summary
        return StatePublish(queue if queue_changed else None, residency, summary)
