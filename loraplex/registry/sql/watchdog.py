"""A deadline on each wait for a database server, enforced from outside the waiting thread.

NOTE: psycopg waits for a server's answer without limit, and the server's own statement
timeout does not help when the server (or its host, or the network to it) is frozen: nothing
answers at all. One thread per database watches the statement in flight; past its deadline it
shuts the connection's socket down, which wakes the waiting thread with an error (the
connection is then broken, and its owner must never use it again).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class Watch:
    """One statement being watched."""

    fd: int  # the connection's socket
    deadline: float  # monotonic seconds
    fired: bool = False  # the deadline passed and the socket was shut down


class Watchdog:
    """Shuts down a watched socket ``limit_s`` after its watch began, unless the watch ended.

    One watch at a time (a database's transactions hold its one connection in turn). The thread
    starts with the first watch and sleeps between deadlines: a watch begun while it sleeps
    toward an earlier deadline (every deadline is ``limit_s`` after its start) costs no wake-up.
    """

    def __init__(self, limit_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._limit_s = limit_s
        self._clock = clock
        self._cond = threading.Condition()
        self._watch: Watch | None = None
        self._thread: threading.Thread | None = None
        self._idle = False  # the thread waits for a watch, with no deadline to wake it
        self._stopped = False

    @contextmanager
    def watching(self, fd: int) -> Iterator[Watch]:
        watch = Watch(fd, self._clock() + self._limit_s)
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="registry-db-watchdog", daemon=True
                )
                self._thread.start()
            self._watch = watch
            if self._idle:
                self._cond.notify()
        try:
            yield watch
        finally:
            with self._cond:
                self._watch = None

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                watch = self._watch
                self._idle = watch is None
                if watch is None:
                    self._cond.wait()
                    continue
                remaining = watch.deadline - self._clock()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                watch.fired = True
                self._watch = None
                _shut_down(watch.fd)


def _shut_down(fd: int) -> None:
    """Shut the socket behind ``fd`` down for both directions (through a duplicate, so the
    owner's descriptor is never closed under it): a thread waiting on it wakes at once."""
    try:
        duplicate = socket.socket(fileno=os.dup(fd))
    except OSError:
        return  # already closed: nothing waits on it
    # OSError: already shut down, or not connected any more
    with duplicate, contextlib.suppress(OSError):
        duplicate.shutdown(socket.SHUT_RDWR)
