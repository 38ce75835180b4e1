"""One engine child process and its pipe (``process.py`` supervises a series of them).

A link is started (its child imports ``preload`` while it waits to be told what to build: a link
may be started before the server knows that, see ``serve/worker.py``), given its ``Build``,
awaited until its child says it is ready, read until its pipe reaches EOF
(the child exited, whatever killed it), then closed: the child is reaped and the pipe and the
process sentinel are closed, so a restart leaves no zombie and no file descriptor behind.

What goes to the child is written by the link's own writer thread: ``send`` only queues. A child
that does not read (stopped, wedged) fills the pipe's 64 KiB in a few dozen requests, and a
write from the server's event loop would then block every route, ``/health`` included, until
it read again (issue 25's hung engine; ``tests/server/test_engine_watchdog.py``).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import queue
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from loraplex.engine.transport.messages import Build, Ready, StartFailed, Stop
from loraplex.engine.transport.packed_errors import unpack_error
from loraplex.engine.transport.proc_threads import any_thread_runnable
from loraplex.engine.transport.process_child import Ahead, child_main
from loraplex.engine.transport.worker import WorkerHandles
from loraplex.errors import EngineUnavailableError

_log = logging.getLogger(__name__)
_POLL_S = 0.1  # how often a start checks for the child's death and for cancellation
_CLOSE = object()  # ends the writer thread


class ChildLink:
    """A spawned engine child and the parent's end of its duplex pipe."""

    def __init__(
        self, preload: tuple[str, ...] = (), *, fork: bool = False, ahead: Ahead | None = None
    ) -> None:
        """``preload``: modules the child imports at once, before it is told what to build.
        ``fork``: the child is a fork of this process (it starts at once, with what this process
        imported so far) instead of a fresh interpreter; only for a caller that has started no
        thread yet (``serve.worker.spawn_engine_child``: the first child). ``ahead``: a call
        (picklable, with its arguments) the child makes before the preload, for work it can
        start before it is told what to build (``serve.worker.engine_ahead``: the checkpoint's
        load); what it raises is the first start's error, as a failed preload's."""
        if fork and threading.active_count() > 1:
            raise ValueError("fork is invalid with threads running; expected a spawned child")
        context = mp.get_context("fork") if fork else mp.get_context("spawn")
        self._conn, child_conn = context.Pipe(duplex=True)
        # NOTE: a forked child inherits every descriptor, this end of the pipe too: it closes
        # it first (``child_main``), or it would never read EOF when this process dies, and an
        # orphaned engine would keep running (found after a killed benchmark run).
        self._process = context.Process(
            target=child_main,
            args=(child_conn, preload, self._conn if fork else None, ahead),
            name="loraplex-engine",
            daemon=True,
        )
        try:
            self._process.start()
        except BaseException:
            self._conn.close()
            raise
        finally:
            child_conn.close()
        self.pid: int | None = self._process.pid
        self.exitcode: int | None = None  # set by close()
        self._state_lock = threading.Lock()  # close() and kill() run on different threads
        self._closed = False
        self._outbox: queue.SimpleQueue[object] = queue.SimpleQueue()  # to the writer, in order
        self._broken: BaseException | None = None  # why the writer stopped early
        self._writer = threading.Thread(
            target=self._write_loop, name="loraplex-engine-writer", daemon=True
        )
        self._writer.start()
        self._built = False

    def build(
        self,
        builder: Callable[..., WorkerHandles],
        args: tuple[Any, ...],
        intervals: tuple[float, float, float],
    ) -> None:
        """Tells the child what to build (``builder(*args)``, picklable) and its (state publish,
        heartbeat, alive) periods in seconds; once per link, before ``await_ready``."""
        if self._built:
            raise ValueError("the engine process was already told what to build")
        self._built = True
        self.send(Build(builder, args, intervals))

    def await_ready(self, timeout_s: float, cancel: threading.Event) -> int:
        """The child's ``max_loras`` once it is ready. On failure the link is closed and the
        child's own error (or EngineUnavailableError) raised."""
        try:
            return self._await_ready(timeout_s, cancel)
        except BaseException:
            self.kill()
            self.close()
            raise

    def _await_ready(self, timeout_s: float, cancel: threading.Event) -> int:
        if not self._built:
            raise EngineUnavailableError("the engine process was not told what to build")
        deadline = time.monotonic() + timeout_s
        while not self._conn.poll(_POLL_S):
            if not self._process.is_alive():
                self._process.join()
                raise EngineUnavailableError(
                    f"the engine process exited with code {self._process.exitcode} while starting"
                )
            if cancel.is_set():
                raise EngineUnavailableError("the engine process start was cancelled")
            if time.monotonic() > deadline:
                raise EngineUnavailableError(f"the engine process did not start in {timeout_s} s")
        try:
            message = self._conn.recv()
        except EOFError as exc:
            raise EngineUnavailableError("the engine process exited while starting") from exc
        if isinstance(message, StartFailed):
            self._process.join()  # it returns by itself after reporting
            raise unpack_error(message.error)
        if not isinstance(message, Ready):
            raise EngineUnavailableError(f"the engine process sent {type(message).__name__} first")
        return message.max_loras

    def send(self, message: object) -> None:
        """Queues ``message`` for the child, in order, and returns at once. Raises ValueError
        once the pipe is known broken or the link closed (a child that died meanwhile is seen
        by the reader: EOF)."""
        if self._broken is not None or self._closed:
            raise ValueError("the engine process pipe is closed")
        self._outbox.put(message)

    def _write_loop(self) -> None:
        while (message := self._outbox.get()) is not _CLOSE:
            try:
                self._conn.send(message)
            except (OSError, ValueError) as exc:  # the child is gone, or the link closed
                self._broken = exc
                return

    def poll(self, timeout_s: float) -> bool:
        """True when a message (or EOF) is there to ``recv`` within ``timeout_s``."""
        return self._conn.poll(timeout_s)

    def recv(self) -> object:
        """The child's next message; EOFError once it exited (or the link is closed)."""
        message: object = self._conn.recv()
        return message

    def runnable(self) -> bool:
        """Whether a thread of the child is running or waiting for a CPU (Linux ``/proc``; False
        where it cannot be read): its silence is then the machine's load, not a freeze."""
        return self.pid is not None and any_thread_runnable(self.pid)

    def request_stop(self) -> None:
        """Asks the child to stop (its live requests end, its cache closes); it then exits and
        the reader sees EOF."""
        with contextlib.suppress(OSError, ValueError):
            self.send(Stop())

    def kill(self) -> None:
        with self._state_lock:
            if not self._closed:
                self._process.kill()

    def close(self, grace_s: float = 10.0) -> None:
        """Reaps the child (killed after ``grace_s``), then closes the pipe and the sentinel."""
        with self._state_lock:
            if self._closed:
                return
            self._process.join(grace_s)
            if self._process.exitcode is None:
                _log.warning(
                    "engine process %s did not exit in %s s; killing it", self.pid, grace_s
                )
                self._process.kill()
                self._process.join()
            self.exitcode = self._process.exitcode
            # The child is gone: a write the writer is blocked in fails now, so it ends.
            self._outbox.put(_CLOSE)
            self._writer.join(grace_s)
            self._conn.close()
            self._process.close()
            self._closed = True

    def describe_exit(self) -> str:
        """How the child ended, for messages ("was killed by SIGKILL"); after ``close()``."""
        code = self.exitcode
        if code is None:
            return "stopped"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"was killed by {signal.Signals(-code).name}"
            return f"was killed by signal {-code}"
        return f"exited with code {code}"
