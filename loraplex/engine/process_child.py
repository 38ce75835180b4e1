"""The engine process's side: what a builder returns, errors across the pipe, and the loop
that serves the parent's commands (``engine/process.py`` says why the engine has a process).

Messages on the duplex pipe:

- parent -> child: ``("add", EngineRequest)``, ``("abort", request_id)``,
  ``("call", call_id, method, args)`` for the cache-control methods in ``_CALLS``, ``("stop",)``;
- child -> parent: ``("ready", max_loras)`` or ``("failed", error)`` once; after every engine
  step that produced output one ``("out", [(request_id, delta or error), ...])``;
  ``("state", EngineLoad, {key: ready tiers})`` at most every ``state_interval_s``;
  ``("reply", call_id, ok, value)`` and, for pin/prefetch, ``("done", call_id, error)`` when the
  load finishes.

Errors cross the pipe as (module, class name, args, attributes) and are rebuilt without calling
the class's ``__init__``: domain errors have keyword-rich constructors that pickle cannot replay.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.core import EngineCore
from loraplex.engine.protocol import EngineRequest, TokenDelta
from loraplex.engine.tenancy import TenantSettings
from loraplex.engine.thread_client import EngineThread, engine_load
from loraplex.errors import EngineUnavailableError
from loraplex.residency.cache.tiered_cache import TieredAdapterCache
from loraplex.residency.ledger import CACHED_TIERS, Tier

# Cache-control methods the parent may call in the child (anything else is refused).
_CALLS = ("snapshot", "pin", "prefetch", "unpin", "evict", "set_warm_policy", "update_tenants")
_FUTURE_CALLS = ("pin", "prefetch")


@dataclass(frozen=True)
class WorkerHandles:
    """What a builder returns in the child."""

    core: EngineCore  # the engine core (driven by an EngineThread the child starts)
    idle_wait_s: float  # the engine thread's idle sleep
    max_loras: int  # GPU adapter slots
    update_tenants: Callable[[Mapping[str, TenantSettings]], None]  # live tenant settings
    close: Callable[[], None]  # after the engine thread stopped: close the cache, registry...


# --- errors across the pipe ------------------------------------------------------------------

PackedError = tuple[str, str, tuple[Any, ...], dict[str, Any]]


def pack_error(exc: BaseException) -> PackedError:
    """A picklable description of ``exc`` (its class by module and name, args and attributes)."""
    cls = type(exc)
    state = {k: v for k, v in vars(exc).items() if _plain(v)}
    args = tuple(a for a in exc.args if _plain(a))
    return (cls.__module__, cls.__qualname__, args, state)


def unpack_error(packed: PackedError) -> BaseException:
    """The exception ``pack_error`` described; RuntimeError when its class cannot be found."""
    module, qualname, args, state = packed
    try:
        cls = getattr(importlib.import_module(module), qualname)
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise TypeError(qualname)
        exc = cls.__new__(cls)
        BaseException.__init__(exc, *args)
        exc.__dict__.update(state)
        return exc
    except Exception:  # an unknown class: keep the message
        return RuntimeError(f"{module}.{qualname}: {args[0] if args else ''}")


def _plain(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool | tuple | list | dict)


# --- the child ---------------------------------------------------------------------------------


class _Child:
    """The child's side of the pipe: commands in, batched output and state out."""

    def __init__(self, conn: Connection, handles: WorkerHandles, state_interval_s: float) -> None:
        self._conn = conn
        self._handles = handles
        self._core = handles.core
        self._cache: TieredAdapterCache | None = handles.core.cache
        self._send_lock = threading.Lock()
        self._out_lock = threading.Lock()
        self._out: list[tuple[str, TokenDelta | PackedError]] = []
        self._state_interval_s = state_interval_s
        self._last_state = 0.0
        self._thread = EngineThread(handles.core, handles.idle_wait_s, self._deliver)

    def send(self, message: tuple[Any, ...]) -> None:
        with self._send_lock:
            self._conn.send(message)

    def run(self) -> None:
        """Answers commands until ``stop`` or until the parent is gone."""
        try:
            while True:
                try:
                    message = self._conn.recv()
                except (EOFError, OSError):
                    return
                if message[0] == "stop":
                    return
                self._command(message)
        finally:
            self._thread.stop()
            self._handles.close()

    def _command(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "add":
            request: EngineRequest = message[1]
            self._thread.submit(lambda: self._add(request))
        elif kind == "abort":
            request_id: str = message[1]
            self._thread.submit(lambda: self._core.abort(request_id))
        elif kind == "call":
            self._call(message[1], message[2], message[3])

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

    def _call(self, call_id: int, method: str, args: tuple[Any, ...]) -> None:
        try:
            if method not in _CALLS:
                raise ValueError(f"method {method!r} is invalid; expected one of {_CALLS}")
            value = self._invoke(method, args)
        except Exception as exc:
            self.send(("reply", call_id, False, pack_error(exc)))
            return
        if method in _FUTURE_CALLS:
            future: Future[None] = value
            self.send(("reply", call_id, True, future.done()))
            future.add_done_callback(lambda f: self._done(call_id, f))
        else:
            self.send(("reply", call_id, True, value))

    def _invoke(self, method: str, args: tuple[Any, ...]) -> Any:
        if method == "update_tenants":
            self._handles.update_tenants(args[0])
            return None
        if self._cache is None:
            raise EngineUnavailableError("this engine has no adapter cache")
        return getattr(self._cache, method)(*args)

    def _done(self, call_id: int, future: Future[None]) -> None:
        error = None if future.cancelled() else future.exception()
        with contextlib.suppress(OSError, ValueError):  # the parent may be gone
            self.send(("done", call_id, None if error is None else pack_error(error)))

    def _deliver(self) -> None:
        """Runs on the engine thread after the commands and after each step."""
        with self._out_lock:
            out, self._out = self._out, []
        try:
            if out:
                self.send(("out", out))
            now = time.monotonic()
            if now - self._last_state >= self._state_interval_s:
                self._last_state = now
                tiers = self._residency()
                running = tuple(k for k, held in tiers.items() if Tier.L0 in held)
                load = engine_load(self._core, self._handles.max_loras, running)
                self.send(("state", load, tiers))
        except (OSError, ValueError):  # the parent is gone; run() sees EOF and stops
            pass

    def _residency(self) -> dict[AdapterKey, tuple[Tier, ...]]:
        tiers: dict[AdapterKey, tuple[Tier, ...]] = {}
        if self._cache is not None:
            for tier in CACHED_TIERS:
                for key in self._cache.residency(tier):
                    tiers[key] = (*tiers.get(key, ()), tier)
        return tiers


def child_main(
    conn: Connection, builder: Callable[..., WorkerHandles], args: tuple[Any, ...],
    state_interval_s: float,
) -> None:  # fmt: skip
    try:
        handles = builder(*args)
    except BaseException as exc:
        conn.send(("failed", pack_error(exc)))
        conn.close()
        return
    child = _Child(conn, handles, state_interval_s)
    gc.collect()
    gc.freeze()  # the model and caches are built: keep collections from walking them
    child.send(("ready", handles.max_loras))
    child.run()
    conn.close()
