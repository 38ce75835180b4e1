"""PostgreSQL engine: the registry shared by several machines.

Write transactions take one transaction-scoped advisory lock, the PostgreSQL counterpart of
SQLite's ``BEGIN IMMEDIATE``: administrative writes are rare, and serialising them keeps every
read-check-write sequence correct under READ COMMITTED without per-table locking.

Nothing waits on the server without a limit (``timeouts.py``): a connection opens within the
connect timeout; the server cancels a statement past the statement timeout and a lock wait
(row, table or the advisory write lock) past the lock timeout; and the client gives a server
up that sent no answer within the statement timeout plus a grace (``watchdog.py``: a frozen
process or host reports nothing). Each fails only the call at hand, with
``RegistryUnavailableError``, its transaction rolled back (by the server when the connection
was given up: nothing was committed). A connection that broke, was given up or was left
mid-transaction is closed and never used again; the next transaction opens a new one (so does
one on a connection the server closed while it was idle, e.g. a restarted server).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus

from loraplex.errors import RegistryUnavailableError
from loraplex.registry.sql.db import Row
from loraplex.registry.sql.seats import Seats, unnested
from loraplex.registry.sql.timeouts import DatabaseTimeouts, database_pool_size
from loraplex.registry.sql.watchdog import Watch, Watchdog

_log = logging.getLogger(__name__)

# Arbitrary constant naming "the loraplex registry write lock" among advisory locks.
_WRITE_LOCK_KEY = 0x6C70785F726567

# An idle connection past this is closed (one is kept open): a burst's connections do not stay
# open for the life of the process (each holds a server backend, counted against the server's
# max_connections, for every process of every machine using the registry).
IDLE_CLOSE_S = 60.0


class _PostgresTx:
    def __init__(self, conn: psycopg.Connection[Row], watch: Watch) -> None:
        self._conn = conn
        self._watch = watch

    def execute(self, sql: str, params: Sequence[object] = ()) -> None:
        self._run(sql, params)

    def query(self, sql: str, params: Sequence[object] = ()) -> list[Row]:
        return self._run(sql, params).fetchall()

    def query_one(self, sql: str, params: Sequence[object] = ()) -> Row | None:
        return self._run(sql, params).fetchone()

    def _run(self, sql: str, params: Sequence[object]) -> psycopg.Cursor[Row]:
        self._watch.renew()
        return self._conn.execute(_placeholders(sql), tuple(params) or None)


class PostgresDatabase:
    """A registry database on a PostgreSQL server (``postgresql://`` URL, libpq syntax).

    A pool of at most ``pool_size`` connections (``database_pool_size``), each used by one
    transaction at a time and opened with the same limits; one is opened at once (a wrong URL
    fails at start), the others as concurrent calls need them, and closed once idle for
    ``idle_close_s`` (the last open one is kept). Transactions other than tenant requests'
    (``serving``) hold at most all but ``seats.SERVING_RESERVE`` of them at once. A call
    finding every connection it may take busy waits for one at most the client's wait limit. Write
    transactions of this process queue for one another here first (as long), then take the
    server's advisory lock (which other processes hold, within the lock timeout), so that a
    write waiting for another write holds no connection and no lock wait.

    After a fork the child never uses the parent's connections (it closes its copies of their
    sockets, which leaves the parent's sessions alone) nor the parent's watchdog and idle-close
    threads (gone in the child): it opens its own, as calls need them.
    """

    def __init__(
        self,
        url: str,
        timeouts: DatabaseTimeouts | None = None,
        pool_size: int | None = None,
        idle_close_s: float = IDLE_CLOSE_S,
    ) -> None:
        if not idle_close_s > 0:
            raise ValueError(f"idle_close_s {idle_close_s!r} is invalid; expected > 0")
        self._dsn = url
        self._timeouts = timeouts or DatabaseTimeouts()
        self._pool_size = database_pool_size(pool_size)
        self._idle_close_s = idle_close_s
        self._closed = False
        self._inherited: list[psycopg.Connection[Row]] = []  # a parent's, never used (forks)
        self._start_process()
        given = conninfo_to_dict(url)  # for messages before a connection says where it is
        self._url = _where(given.get("host", ""), given.get("port", ""), given.get("dbname", ""))
        first = self._connect()
        info = first.info
        self._url = _where(info.host, info.port, info.dbname)
        with self._cond:
            self._open.add(first)
            self._seats.idle.append(first)
            self._idle_at[first] = time.monotonic()
        _ALIVE.add(self)

    def _start_process(self) -> None:
        """This process's pool state: empty, with new locks and a new watchdog."""
        self._seats: Seats[psycopg.Connection[Row]] = Seats(self._pool_size, "connections")
        self._cond = self._seats.cond
        self._open: set[psycopg.Connection[Row]] = set()  # idle or in a transaction
        self._idle_at: dict[psycopg.Connection[Row], float] = {}  # when each idle one returned
        self._reaper: threading.Thread | None = None  # closes idle connections past the bound
        self._reaper_stop = threading.Event()
        self._write_lock = threading.Lock()
        self._local = threading.local()  # .active: this thread is in a transaction
        self._watchdog = Watchdog(self._timeouts.client_wait_s)

    @property
    def dialect(self) -> str:
        return "postgres"

    @property
    def url(self) -> str:
        return self._url

    @property
    def pool_size(self) -> int:
        return self._pool_size

    @contextmanager
    def transaction(self, write: bool = True, serving: bool = False) -> Iterator[_PostgresTx]:
        with unnested(self._local), self._write_turn(write):
            conn = self._checkout(serving)
            try:
                with self._watched(conn, write) as tx:
                    yield tx
            finally:
                self._checkin(conn, serving)

    @contextmanager
    def _write_turn(self, write: bool) -> Iterator[None]:
        """This process's turn to write, waited for at most the client's wait limit (nothing
        for a read)."""
        if not write:
            yield
            return
        lock = self._write_lock  # NOTE: the one to release, even if a fork replaced it
        wait_s = self._timeouts.client_wait_s
        if not lock.acquire(timeout=wait_s):
            raise RegistryUnavailableError(
                f"another write in this process went on for {wait_s:g} s"
            )
        try:
            yield
        finally:
            lock.release()

    @contextmanager
    def _watched(self, conn: psycopg.Connection[Row], write: bool) -> Iterator[_PostgresTx]:
        """A transaction on ``conn`` under the watchdog (a write with the advisory lock)."""
        with self._watchdog.watching(conn.fileno()) as watch:
            try:
                with conn.transaction():
                    tx = _PostgresTx(conn, watch)
                    if write:
                        tx.execute("SELECT pg_advisory_xact_lock(?)", (_WRITE_LOCK_KEY,))
                    try:
                        yield tx
                    finally:
                        watch.renew()  # the commit (or rollback) gets the whole limit
            except psycopg.OperationalError as exc:
                raise self._unavailable(exc, conn, watch.fired) from exc

    def is_unique_violation(self, exc: BaseException) -> bool:
        return isinstance(exc, psycopg.errors.UniqueViolation)

    def close(self) -> None:
        """Closes the idle connections at once, the busy ones as their transactions end."""
        with self._cond:
            self._closed = True
            idle, self._seats.idle = self._seats.idle, []
            self._open.difference_update(idle)
            self._idle_at.clear()
            self._cond.notify_all()
        self._reaper_stop.set()
        for conn in idle:
            conn.close()
        self._watchdog.stop()
        _ALIVE.discard(self)

    def _checkout(self, serving: bool) -> psycopg.Connection[Row]:
        """An idle connection (one the server closed meanwhile replaced), else a new one while
        the pool has room, else the first one returned within the client's wait limit; not
        ``serving``: only while other such transactions hold fewer than their share."""
        conn = self._seats.take(
            serving,
            self._timeouts.client_wait_s,
            lambda: len(self._open),
            lambda: self._closed,
            self._idle_at.pop,
        )
        if conn is not None:
            if _reusable(conn, idle_check=True):
                return conn
            self._drop(conn, opening=True)
        try:
            conn = self._connect()
        except BaseException:
            self._seats.open_failed(serving)
            raise
        with self._cond:
            self._seats.opening -= 1
            self._open.add(conn)
        return conn

    def _checkin(self, conn: psycopg.Connection[Row], serving: bool) -> None:
        """Back to the idle ones; closed instead when broken, given up, left mid-transaction
        or the database closed (or it is a parent's, after a fork: left alone).

        NOTE: every waiter is woken (not one): a waiter for the other share may be unable to
        take what was freed, and a single wake-up spent on it would leave the able one waiting.
        """
        with self._cond:
            if conn not in self._open:
                return
            self._seats.returned(serving)
            if not self._closed and _reusable(conn):
                self._seats.idle.append(conn)
                self._idle_at[conn] = time.monotonic()
                self._cond.notify_all()
                if self._reaper is None and len(self._open) > 1:
                    self._reaper = threading.Thread(
                        target=self._reap, name="registry-db-idle-close", daemon=True
                    )
                    self._reaper.start()
                return
        self._drop(conn)

    def _reap(self) -> None:
        """Closes idle connections once idle for ``idle_close_s``, the longest idle first, all
        but the last open one; ends when none is left to close (a check-in starts another)."""
        stop = self._reaper_stop  # NOTE: this process's (a fork makes a new one)
        while True:
            expired: list[psycopg.Connection[Row]] = []
            wake_in = 0.0
            with self._cond:
                cutoff = time.monotonic() - self._idle_close_s
                idle = self._seats.idle
                while idle and len(self._open) > 1 and self._idle_at[idle[0]] <= cutoff:
                    conn = idle.pop(0)  # the longest idle (returned first)
                    del self._idle_at[conn]
                    self._open.discard(conn)
                    expired.append(conn)
                done = self._closed or not idle or len(self._open) <= 1
                if done:
                    self._reaper = None
                else:
                    wake_in = self._idle_at[idle[0]] - cutoff
            for conn in expired:
                conn.close()
            if done or stop.wait(wake_in):
                return

    def _drop(self, conn: psycopg.Connection[Row], opening: bool = False) -> None:
        """Closes ``conn`` and frees its place in the pool (``opening``: for a new one that
        this caller opens next)."""
        conn.close()
        with self._cond:
            self._open.discard(conn)
            if opening:
                self._seats.opening += 1
            else:
                self._cond.notify_all()

    def _after_fork_in_child(self) -> None:
        """Forget the parent's connections (closing this process's copies of their sockets
        only: ``conn.close()`` would end the parent's sessions) and its watchdog."""
        for conn in self._open:
            with contextlib.suppress(OSError):
                os.close(conn.fileno())
        # NOTE: kept referenced: a collected psycopg connection warns that it was not closed
        self._inherited.extend(self._open)
        self._start_process()

    def _connect(self) -> psycopg.Connection[Row]:
        """A new connection with the limits set; RegistryUnavailableError when none opens."""
        t = self._timeouts
        try:
            conn: psycopg.Connection[Row] = psycopg.connect(
                self._dsn, autocommit=True, connect_timeout=int(t.connect_timeout_s)
            )
        except psycopg.OperationalError as exc:
            raise self._unavailable(exc, None) from exc
        try:
            with self._watchdog.watching(conn.fileno()) as watch:
                try:
                    _PostgresTx(conn, watch).execute(
                        "SELECT set_config('statement_timeout', ?, false), "
                        "set_config('lock_timeout', ?, false)",
                        (_milliseconds(t.statement_timeout_s), _milliseconds(t.lock_timeout_s)),
                    )
                except psycopg.OperationalError as exc:
                    raise self._unavailable(exc, conn, watch.fired) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _unavailable(
        self,
        exc: psycopg.OperationalError,
        conn: psycopg.Connection[Row] | None,
        given_up: bool = False,
    ) -> RegistryUnavailableError:
        """The error for ``exc`` on ``conn`` (None: none opened; ``given_up``: after the
        watchdog shut it down), its reason one of a few fixed phrases (the server's text and
        address go to the log only: a tenant's request may be the one that failed)."""
        t = self._timeouts
        if given_up:
            reason = f"no answer within {t.client_wait_s:g} s"
        elif isinstance(exc, psycopg.errors.LockNotAvailable):
            reason = f"lock timeout ({t.lock_timeout_s:g} s) expired"
        elif isinstance(exc, psycopg.errors.QueryCanceled):
            reason = f"statement timeout ({t.statement_timeout_s:g} s) expired"
        elif isinstance(exc, psycopg.errors.ConnectionTimeout):
            reason = f"no connection within {t.connect_timeout_s:g} s"
        elif conn is None or conn.closed:
            reason = "connection failed or lost"
        else:
            reason = f"server error {exc.sqlstate or 'without a code'}"
        _log.warning("registry database %s: %s (%s)", self._url, reason, exc)
        return RegistryUnavailableError(reason)


# Every open PostgresDatabase of this process, for the fork hook below.
_ALIVE: weakref.WeakSet[PostgresDatabase] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for db in list(_ALIVE):
        db._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _reusable(conn: psycopg.Connection[Row], idle_check: bool = False) -> bool:
    """Whether ``conn`` is open and out of any transaction; with ``idle_check``, also that the
    server sent nothing since (an idle connection receives bytes only when the server ends it:
    a shutdown or a terminated backend)."""
    if conn.closed or conn.info.transaction_status != TransactionStatus.IDLE:
        return False
    if not idle_check:
        return True
    poller = select.poll()  # NOTE: not select.select: a busy server's fds pass 1024
    poller.register(conn.fileno(), select.POLLIN)
    return not poller.poll(0)


def _where(host: object, port: object, dbname: object) -> str:
    return f"postgresql://{host}:{port}/{dbname}"


def _milliseconds(seconds: float) -> str:
    return str(max(1, round(seconds * 1000)))


def _placeholders(sql: str) -> str:
    """Registry SQL uses ``?``; psycopg wants ``%s`` (and never sees a literal ``%``)."""
    return sql.replace("?", "%s")
