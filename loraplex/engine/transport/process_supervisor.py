"""The engine child supervised (torch-free): its start, the IO thread that reads its pipe and acts
on the watchdog's verdicts, its restart, and shutdown.

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

The middle layer of ``process.EngineProcess``, over the state ``process_gate.ChildGate`` keeps.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from loraplex.engine.transport.messages import (
    Alive,
    Heartbeat,
    LoadDone,
    Reply,
    StatePublish,
    StepOut,
)
from loraplex.engine.transport.process_gate import ChildGate
from loraplex.engine.transport.process_link import ChildLink
from loraplex.engine.transport.process_replay import send_unawaited
from loraplex.engine.transport.restart import Backoff, RestartPolicy
from loraplex.engine.transport.worker import WorkerHandles
from loraplex.engine.watchdog import Cause, ProgressWatchdog, Verdict, WatchdogPolicy
from loraplex.errors import EngineUnavailableError

_log = logging.getLogger(__name__)
_PROGRESS = (StepOut, StatePublish, Heartbeat)  # sent by the child's engine loop only
_MAX_TICK_S = 0.25  # the IO thread checks the watchdog at least this often


class ChildSupervisor(ChildGate):
    """Starts, watches and restarts the engine child (see the module docstring)."""

    def __init__(
        self,
        builder: Callable[..., WorkerHandles],
        args: tuple[Any, ...],
        *,
        start_timeout_s: float,
        call_timeout_s: float,
        state_interval_s: float,
        restart: RestartPolicy | None,
        watchdog: WatchdogPolicy | None,
        preload: tuple[str, ...],
    ) -> None:
        """Nothing starts yet: ``_start`` does, once the client's own fields are set."""
        super().__init__()
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
        self._handlers: dict[type, Callable[[Any], None]] = {
            StepOut: self._inflight.on_step_out,
            Reply: self._inflight.on_reply,
            LoadDone: self._inflight.on_load_done,
            StatePublish: self._state.apply,
            Heartbeat: lambda beat: None,
            Alive: lambda beat: None,
        }

    def _start(self, child: ChildLink | None, wait_ready: bool) -> None:
        """Builds the first child (``child`` if given, already spawned) and starts the IO
        thread; with ``wait_ready``, first awaits the child (raising why it failed)."""
        self._link = self._build(child if child is not None else ChildLink(self._preload))
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

    # --- supervision --------------------------------------------------------------------------

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
