"""The engine in its own process: ``EngineProcess`` is the EngineClient the server uses by default.

Why a process: the HTTP layer (auth, resolution, JSON, per-token SSE) and the engine's Python
between torch calls both need the interpreter lock. On one process they take turns, and every
torch call the engine makes can wait up to a switch interval for the event loop to yield it.
A child process gives the engine its own interpreter (vLLM's V1 engine core runs apart from its
API server for the same reason).

The child is started with ``spawn`` and builds everything that touches the model from a
picklable ``builder`` (a module-level function and its arguments) returning ``WorkerHandles``:
the engine core, its adapter cache, and how to apply tenant settings and close. It then runs an
``EngineThread`` and answers one duplex pipe:

after every step one message carries all of that step's deltas, and a published state (load,
residency) answers ``load_snapshot`` and ``RemoteCache.is_resident`` without a round trip
(messages: ``engine/process_child.py``).

Errors cross the pipe with their types and attributes (``process_child.pack_error``). When the
child dies, every live stream fails with ``EngineUnavailableError`` (503), ``load_snapshot``
raises it (so ``/ready`` says 503), and the child exits by itself when the parent goes away
(its pipe reaches EOF).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing as mp
import threading
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from concurrent.futures import Future
from typing import Any

from loraplex.adapters.identity import AdapterKey
from loraplex.adapters.tiering import Tier
from loraplex.engine.engine import Mailbox, Mailboxes, Outbox, outbox_stream
from loraplex.engine.process_child import PackedError, WorkerHandles, child_main, unpack_error
from loraplex.engine.protocol import EngineLoad, EngineRequest, TokenDelta
from loraplex.engine.remote_cache import RemoteCache
from loraplex.engine.tenancy import TenantSettings
from loraplex.errors import EngineUnavailableError
from loraplex.model.tokenizer import TextTokenizer

_log = logging.getLogger(__name__)


class EngineProcess:
    """EngineClient over an engine in a child process (see the module docstring)."""

    def __init__(
        self,
        builder: Callable[..., WorkerHandles],
        args: tuple[Any, ...],
        tokenizer: TextTokenizer,
        *,
        start_timeout_s: float = 600.0,
        call_timeout_s: float = 30.0,
        state_interval_s: float = 0.02,
    ) -> None:
        self._tokenizer = tokenizer
        self._call_timeout_s = call_timeout_s
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()  # streams, calls, state
        self._streams: dict[str, tuple[Mailbox, Outbox]] = {}
        self._calls: dict[int, Future[Any]] = {}
        self._deferred: dict[int, Future[None]] = {}
        self._call_ids = itertools.count()
        self._mailboxes = Mailboxes()
        self._dead: BaseException | None = None
        self.residency: dict[AdapterKey, tuple[Tier, ...]] = {}  # ready tiers per adapter
        self.cache = RemoteCache(self)  # the child's adapter cache, for the admin API
        context = mp.get_context("spawn")
        self._conn, child_conn = context.Pipe(duplex=True)
        self._process = context.Process(
            target=child_main, args=(child_conn, builder, args, state_interval_s),
            name="loraplex-engine", daemon=True,
        )  # fmt: skip
        self._process.start()
        child_conn.close()
        self._max_loras = self._await_ready(start_timeout_s)
        self._load = EngineLoad(0, 0, 0, 0.0, (), (), self._max_loras)
        self._reader = threading.Thread(target=self._read, name="loraplex-engine-io", daemon=True)
        self._reader.start()

    def _await_ready(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while not self._conn.poll(0.1):
            if not self._process.is_alive():
                self._process.join()
                raise EngineUnavailableError(
                    f"the engine process exited with code {self._process.exitcode} while starting"
                )
            if time.monotonic() > deadline:
                self._kill()
                raise EngineUnavailableError(f"the engine process did not start in {timeout_s} s")
        try:
            message = self._conn.recv()
        except EOFError as exc:
            self._process.join()
            raise EngineUnavailableError("the engine process exited while starting") from exc
        if message[0] == "failed":
            self._process.join()
            raise unpack_error(message[1])
        max_loras: int = message[1]
        return max_loras

    @property
    def tokenizer(self) -> TextTokenizer:
        return self._tokenizer

    @property
    def pid(self) -> int | None:
        return self._process.pid

    # --- EngineClient ------------------------------------------------------------------------

    def generate(self, request: EngineRequest) -> AsyncGenerator[TokenDelta, None]:
        rid = request.request_id
        outbox: Outbox = asyncio.Queue()
        mailbox = self._mailboxes.of(asyncio.get_running_loop())

        def start() -> None:
            with self._lock:
                self._check_alive()
                if rid in self._streams:
                    raise ValueError(f"request_id {rid!r} is invalid; expected unique")
                self._streams[rid] = (mailbox, outbox)
            self._send(("add", request))

        def stop(finished: bool) -> None:
            with self._lock:
                if self._streams.get(rid, (None, None))[1] is not outbox:
                    return  # never registered (a duplicate id): the live one is not ours
                del self._streams[rid]
            if not finished and self._dead is None:
                with contextlib.suppress(EngineUnavailableError):
                    self._send(("abort", rid))

        return outbox_stream(outbox, start, stop)

    async def abort(self, request_id: str) -> None:
        if self._dead is None:
            self._send(("abort", request_id))

    def load_snapshot(self) -> EngineLoad:
        with self._lock:
            self._check_alive()
            return self._load

    def update_tenant_settings(self, settings: Mapping[str, TenantSettings]) -> None:
        self.call("update_tenants", dict(settings))

    # --- calls --------------------------------------------------------------------------------

    def call(self, method: str, *args: Any) -> Any:
        """Runs ``method`` in the child and returns its result (or raises its error)."""
        with self._lock:
            call_id = next(self._call_ids)
        return self._call(call_id, method, args)

    def call_future(self, method: str, *args: Any) -> Future[None]:
        """A pin/prefetch in the child: the future completes when its load does."""
        deferred: Future[None] = Future()
        with self._lock:
            call_id = next(self._call_ids)
            self._deferred[call_id] = deferred  # before the call: "done" follows its reply
        try:
            self._call(call_id, method, args)
        except BaseException:
            with self._lock:
                self._deferred.pop(call_id, None)
            raise
        return deferred

    def _call(self, call_id: int, method: str, args: tuple[Any, ...]) -> Any:
        future: Future[Any] = Future()
        with self._lock:
            self._check_alive()
            self._calls[call_id] = future
        self._send(("call", call_id, method, args))
        try:
            return future.result(self._call_timeout_s)
        except TimeoutError as exc:
            with self._lock:
                self._calls.pop(call_id, None)
            raise EngineUnavailableError(
                f"the engine process did not answer {method!r} in {self._call_timeout_s} s"
            ) from exc

    # --- plumbing -----------------------------------------------------------------------------

    def _send(self, message: tuple[Any, ...]) -> None:
        try:
            with self._send_lock:
                self._conn.send(message)
        except (OSError, ValueError) as exc:
            raise EngineUnavailableError("the engine process is not running") from exc

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise EngineUnavailableError(str(self._dead))

    def _read(self) -> None:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            try:
                self._dispatch(message)
            except Exception:  # a malformed message must not kill the reader
                _log.exception("engine process message %r failed", message[:1])
        self._fail_all(EngineUnavailableError("the engine process exited"))

    def _dispatch(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "out":
            self._route(message[1])
        elif kind == "state":
            with self._lock:
                self._load, self.residency = message[1], message[2]
        elif kind == "reply":
            _, call_id, ok, value = message
            with self._lock:
                future = self._calls.pop(call_id, None)
            if future is not None:
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(unpack_error(value))
                    with self._lock:
                        self._deferred.pop(call_id, None)
        elif kind == "done":
            _, call_id, error = message
            with self._lock:
                deferred = self._deferred.pop(call_id, None)
            if deferred is not None:
                if error is None:
                    deferred.set_result(None)
                else:
                    deferred.set_exception(unpack_error(error))

    def _route(self, out: list[tuple[str, TokenDelta | PackedError]]) -> None:
        touched: set[Mailbox] = set()
        with self._lock:
            for rid, item in out:
                stream = self._streams.get(rid)
                if stream is None:  # aborted by its client meanwhile
                    continue
                mailbox, outbox = stream
                value = item if isinstance(item, TokenDelta) else unpack_error(item)
                mailbox.post(outbox, value)
                touched.add(mailbox)
        for mailbox in touched:
            mailbox.wake()

    def _fail_all(self, error: EngineUnavailableError) -> None:
        with self._lock:
            if self._dead is None:
                self._dead = error
            streams = list(self._streams.values())
            calls = list(self._calls.values()) + list(self._deferred.values())
            self._calls.clear()
            self._deferred.clear()
        for mailbox, outbox in streams:
            mailbox.post(outbox, error)
            mailbox.wake()
        for future in calls:
            if not future.done():
                future.set_exception(error)

    def _kill(self) -> None:
        self._process.kill()
        self._process.join(10)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stops the child (live requests end with an error, its cache and registry close)."""
        if self._process.is_alive():
            with contextlib.suppress(EngineUnavailableError):
                self._send(("stop",))
            self._process.join(timeout_s)
            if self._process.is_alive():
                _log.warning("engine process did not stop in %s s; killing it", timeout_s)
                self._kill()
        self._conn.close()
        self._reader.join(timeout_s)
        self._fail_all(EngineUnavailableError("the engine process was shut down"))
