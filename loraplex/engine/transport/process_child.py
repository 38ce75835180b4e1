"""The engine process's side: the loop that serves the parent's messages (``process.py`` says
why the engine has a process; ``messages.py`` lists the messages; a builder returns
``worker.WorkerHandles``; errors cross as ``packed_errors.PackedError``).

Torch-free at import time: the builder it is given imports torch when it runs, here in the child.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from loraplex.engine.loop import EngineThread
from loraplex.engine.merge_holds import MergeHolds
from loraplex.engine.protocol import EngineRequest, TokenDelta
from loraplex.engine.sched.stats import QueueView
from loraplex.engine.transport.child_outbox import ChildOutbox
from loraplex.engine.transport.messages import (
    AbortRequest,
    AddRequest,
    Alive,
    Build,
    CacheCall,
    CacheCommand,
    Dedicate,
    Evict,
    Heartbeat,
    HoldMerges,
    LoadDone,
    PauseRequest,
    Pin,
    Prefetch,
    Ready,
    Reply,
    SetWarm,
    Snapshot,
    StartFailed,
    StatePublish,
    StepOut,
    Stop,
    Unpin,
    UpdateTenants,
)
from loraplex.engine.transport.packed_errors import PackedError, pack_error
from loraplex.engine.transport.worker import WorkerHandles
from loraplex.errors import EngineUnavailableError
from loraplex.residency.cache import CacheSummary, TieredAdapterCache

# The engine process's name (Linux truncates it to 15 bytes): ``_name_process``.
ENGINE_PROCESS_NAME = "loraplex-engine"
# How long a stopping child waits for its outbox to reach the parent before it closes the pipe.
_FLUSH_TIMEOUT_S = 10.0

# --- cache commands --------------------------------------------------------------------------

# How each cache command runs on the child's cache (UpdateTenants runs on the handles instead).
_CACHE_COMMANDS: dict[type[CacheCommand], Callable[[TieredAdapterCache, Any], Any]] = {
    Snapshot: lambda cache, c: cache.snapshot(),
    Pin: lambda cache, c: cache.pin(c.key, c.tier),
    Prefetch: lambda cache, c: cache.prefetch(c.key, c.tier),
    Unpin: lambda cache, c: cache.unpin(c.key, c.tier),
    Evict: lambda cache, c: cache.evict(c.key, c.tier),
    SetWarm: lambda cache, c: cache.set_warm_policy(c.key, c.warm),
}


def run_cache_command(cache: TieredAdapterCache, command: CacheCommand) -> Any:
    """``command`` run on ``cache`` (a loading command returns its load's Future); the engine
    child and a fleet's engine replica run cache calls this one way."""
    return _CACHE_COMMANDS[type(command)](cache, command)


def run_hold_command(holds: MergeHolds, command: HoldMerges | Dedicate) -> frozenset[str]:
    """``command`` on an engine's merge holds: the refs merged now (none for a release or a
    dedication); the engine child and a fleet's engine replica run it this one way."""
    if isinstance(command, Dedicate):
        holds.dedicate(command.ref)
        return frozenset()
    if command.hold:
        return holds.hold(command.refs)
    holds.release(command.refs)
    return frozenset()


# --- the child ---------------------------------------------------------------------------------


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


class _Child:
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


@contextlib.contextmanager
def startup_collections() -> Iterator[None]:
    """No garbage collection inside the block, then one, and what survives it frozen.

    Start-up allocates objects that live as long as the process (modules, the model, caches):
    collections during it (about a fifth of torch's import time) free next to nothing, and later
    ones need not walk what survives the start. ``gc.freeze()`` inside the block (after imports)
    spares the one collection the imports too; what garbage they left, a few dozen objects,
    then stays."""
    gc.disable()
    try:
        yield
    finally:
        gc.collect()
        gc.freeze()
        gc.enable()


def child_main(
    conn: Connection, preload: tuple[str, ...], parent_end: Connection | None = None
) -> None:
    """The child's entry point: imports ``preload`` (module names) at once, then builds what the
    parent's ``Build`` names and serves it. The parent may spawn the child before it knows what
    to build, so the imports (torch: seconds) overlap the parent's own start. ``parent_end``:
    the parent's end of the pipe, which a forked child inherited; closed at once, so the pipe
    reaches EOF here when the parent dies, however it dies."""
    _ignore_group_signals()
    if parent_end is not None:
        parent_end.close()
    _name_process()
    with startup_collections():
        built = _built(conn, preload)
    if built is None:
        return
    handles, build = built
    conn.send(Ready(handles.max_loras))  # NOTE: before the engine thread can publish anything
    _Child(conn, handles, build.intervals).run()
    conn.close()


def _built(conn: Connection, preload: tuple[str, ...]) -> tuple[WorkerHandles, Build] | None:
    """The preloads imported, then what the parent's ``Build`` names built (with the Build);
    None, the pipe closed, when that failed (reported to the parent) or no Build came."""
    try:
        for name in preload:
            importlib.import_module(name)
    except BaseException as exc:
        _fail(conn, exc)  # the parent reads it once it has sent the Build
        return None
    gc.freeze()  # the imports: see startup_collections
    try:
        build = conn.recv()
    except (EOFError, OSError):  # the parent went away (or gave up) before it sent one
        return None
    if not isinstance(build, Build):  # Stop: the parent no longer wants this child
        conn.close()
        return None
    try:
        return build.builder(*build.args), build
    except BaseException as exc:
        _fail(conn, exc)
        return None


def _ignore_group_signals() -> None:
    """SIGTERM and SIGINT are left to the parent: sent to the whole process group (a service
    manager's stop, Ctrl-C, ``kill -- -PGID``), they killed this child at once, and the parent,
    not yet told to shut down, reported "engine process ... killed by SIGTERM; restarting it"
    and started another while its own graceful shutdown failed the requests in flight. The
    parent stops this child (``Stop``), and the pipe's EOF does when the parent is gone, however
    it went; SIGKILL still ends it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _name_process() -> None:
    """``ENGINE_PROCESS_NAME`` as this process's name (Linux ``comm``: what ``ps`` and ``top``
    show, and how ``bench.proc_tree.engine_child`` tells a forked engine from its parent, whose
    command line it shares). Elsewhere it keeps its name."""
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_text(ENGINE_PROCESS_NAME, encoding="ascii")


def _fail(conn: Connection, error: BaseException) -> None:
    with contextlib.suppress(OSError, ValueError):  # the parent may be gone
        conn.send(StartFailed(pack_error(error)))
    conn.close()
