"""A deadline on each wait for a database server (or each SQLite read), enforced from outside
the waiting thread.

NOTE: psycopg waits for a server's answer without limit, and the server's own statement
timeout does not help when the server (or its host, or the network to it) is frozen: nothing
answers at all. One thread per database (per process) watches the transactions in flight: a
statement that has not answered ``limit_s`` after it started (or a transaction left idle that
long between statements) has its connection's socket shut down, which wakes the waiting thread
with an error (the connection is then broken, and its owner must never use it again).

A SQLite read transaction past its limit is interrupted the same way (``calling`` with the
connection's ``interrupt``: its running statement fails, the connection stays usable).
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
from functools import partial


@dataclass
class Watch:
    """One transaction being watched; each of its statements renews the deadline."""

    fire: Callable[[], object]  # what the deadline does (shuts the socket down, interrupts)
    limit_s: float  # how long one statement may wait
    clock: Callable[[], float]  # monotonic seconds
    deadline: float = 0.0  # when the socket is shut down unless renewed or ended first
    fired: bool = False  # the deadline passed and the socket was shut down

    def renew(self) -> None:
        """A statement starts: it has the whole limit. NOTE: a plain write, no lock: the
        watchdog reads it again before it fires."""
        self.deadline = self.clock() + self.limit_s


class Watchdog:
    """Shuts down a watched socket (or calls a watch's ``fire``) ``limit_s`` after its watch
    began or was last renewed, unless the watch ended first.

    Several watches at a time (one per connection of a database's pool, each in its own
    transaction). The thread starts with the first watch and sleeps until the earliest
    deadline it saw: a renewal or a new watch (every new deadline is later than the ones before
    it) costs no wake-up, only a check then.

    NOTE: the thread does not survive a fork; a forked child makes a new ``Watchdog`` (its
    copy of this one is dropped unused: its lock may have been held by a thread that is not
    there).
    """

    def __init__(self, limit_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._limit_s = limit_s
        self._clock = clock
        self._cond = threading.Condition()
        self._by_id: dict[int, Watch] = {}  # the watches in flight, by id()
        self._thread: threading.Thread | None = None
        self._idle = False  # the thread waits for a watch, with no deadline to wake it
        self._stopped = False

    @contextmanager
    def watching(self, fd: int) -> Iterator[Watch]:
        """A watch that shuts the socket behind ``fd`` down at its deadline."""
        with self.calling(partial(_shut_down, fd)) as watch:
            yield watch

    @contextmanager
    def calling(self, fire: Callable[[], object]) -> Iterator[Watch]:
        """A watch that calls ``fire`` (on the watchdog's thread) at its deadline."""
        watch = Watch(fire, self._limit_s, self._clock)
        watch.renew()
        with self._cond:
            if self._thread is None:
                self._start()
            self._by_id[id(watch)] = watch
            # NOTE: one line whether it wakes the thread (idle) or not: a traced call runs the
            # same lines whatever the thread is doing (tests/registry/test_resolution_paths.py)
            self._cond.notify(1 if self._idle else 0)
        try:
            yield watch
        finally:
            with self._cond:
                self._by_id.pop(id(watch), None)

    def start(self) -> None:
        """Starts the thread now, not at the first watch (whose lines are then every watch's)."""
        with self._cond:
            if self._thread is None:
                self._start()

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="registry-db-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                self._idle = not self._by_id
                if self._idle:
                    self._cond.wait()
                    continue
                now = self._clock()
                for key, watch in list(self._by_id.items()):
                    if watch.deadline <= now:
                        watch.fired = True
                        del self._by_id[key]
                        watch.fire()
                if self._by_id:
                    earliest = min(watch.deadline for watch in self._by_id.values())
                    self._cond.wait(max(0.0, earliest - self._clock()))


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
