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

import logging
import select
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus

from loraplex.errors import RegistryUnavailableError
from loraplex.registry.sql.db import Row
from loraplex.registry.sql.timeouts import DatabaseTimeouts
from loraplex.registry.sql.watchdog import Watch, Watchdog

_log = logging.getLogger(__name__)

# Arbitrary constant naming "the loraplex registry write lock" among advisory locks.
_WRITE_LOCK_KEY = 0x6C70785F726567


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

    One connection, used by one thread at a time (a transaction holds it; others wait for it
    at most the client's wait limit). Opening connects at once: a wrong URL fails at start.
    """

    def __init__(self, url: str, timeouts: DatabaseTimeouts | None = None) -> None:
        self._dsn = url
        self._timeouts = timeouts or DatabaseTimeouts()
        self._watchdog = Watchdog(self._timeouts.client_wait_s)
        self._lock = threading.RLock()
        self._in_transaction = False  # guards against nesting (SQLite refuses it too)
        self._closed = False
        given = conninfo_to_dict(url)  # for messages before a connection says where it is
        self._url = _where(given.get("host", ""), given.get("port", ""), given.get("dbname", ""))
        self._conn: psycopg.Connection[Row] | None = self._connect()
        info = self._conn.info
        self._url = _where(info.host, info.port, info.dbname)

    @property
    def dialect(self) -> str:
        return "postgres"

    @property
    def url(self) -> str:
        return self._url

    @contextmanager
    def transaction(self, write: bool = True) -> Iterator[_PostgresTx]:
        wait_s = self._timeouts.client_wait_s
        if not self._lock.acquire(timeout=wait_s):
            raise RegistryUnavailableError(f"its connection stayed busy for {wait_s:g} s")
        if self._in_transaction:  # this thread's own (the lock is reentrant)
            self._lock.release()
            raise RuntimeError("registry transactions do not nest")
        self._in_transaction = True
        try:
            conn = self._usable_connection()
            try:
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
                        raise self._unavailable(exc, watch.fired) from exc
            finally:
                if not _reusable(conn):
                    self._discard()
        finally:
            self._in_transaction = False
            self._lock.release()

    def is_unique_violation(self, exc: BaseException) -> bool:
        return isinstance(exc, psycopg.errors.UniqueViolation)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._discard()
            self._watchdog.stop()

    def _usable_connection(self) -> psycopg.Connection[Row]:
        if self._closed:
            raise RegistryUnavailableError("it was closed")
        if self._conn is not None and not _reusable(self._conn, idle_check=True):
            self._discard()
        if self._conn is None:
            self._conn = self._connect()
        return self._conn

    def _connect(self) -> psycopg.Connection[Row]:
        """A new connection with the limits set; RegistryUnavailableError when none opens."""
        t = self._timeouts
        try:
            conn: psycopg.Connection[Row] = psycopg.connect(
                self._dsn, autocommit=True, connect_timeout=int(t.connect_timeout_s)
            )
        except psycopg.OperationalError as exc:
            raise self._unavailable(exc) from exc
        try:
            with self._watchdog.watching(conn.fileno()) as watch:
                try:
                    _PostgresTx(conn, watch).execute(
                        "SELECT set_config('statement_timeout', ?, false), "
                        "set_config('lock_timeout', ?, false)",
                        (_milliseconds(t.statement_timeout_s), _milliseconds(t.lock_timeout_s)),
                    )
                except psycopg.OperationalError as exc:
                    raise self._unavailable(exc, watch.fired) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _discard(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _unavailable(
        self, exc: psycopg.OperationalError, given_up: bool = False
    ) -> RegistryUnavailableError:
        """The error for ``exc`` (``given_up``: after the watchdog shut the connection down),
        its reason one of a few fixed phrases (the server's text and address go to the log
        only: a tenant's request may be the one that failed)."""
        t = self._timeouts
        if given_up:
            reason = f"no answer within {t.client_wait_s:g} s"
        elif isinstance(exc, psycopg.errors.LockNotAvailable):
            reason = f"lock timeout ({t.lock_timeout_s:g} s) expired"
        elif isinstance(exc, psycopg.errors.QueryCanceled):
            reason = f"statement timeout ({t.statement_timeout_s:g} s) expired"
        elif isinstance(exc, psycopg.errors.ConnectionTimeout):
            reason = f"no connection within {t.connect_timeout_s:g} s"
        elif self._conn is None or self._conn.closed:
            reason = "connection failed or lost"
        else:
            reason = f"server error {exc.sqlstate or 'without a code'}"
        _log.warning("registry database %s: %s (%s)", self._url, reason, exc)
        return RegistryUnavailableError(reason)


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
