"""SQLite engine: one file in the data directory, WAL mode, safe with several local processes.

WAL lets readers proceed while one writer commits; ``BEGIN IMMEDIATE`` takes the write lock at
the start of a write transaction, so two processes never interleave read-check-write sequences
(the loser waits up to the busy timeout instead of failing half-way).

Within one process, write transactions take turns on one connection and read transactions run
on a few read-only connections of their own (``READ_CONNECTIONS``), each reading its own
snapshot: a slow read (a large listing, the audit log) holds one of them, and tenants' lookups,
other reads and writes go on beside it, for at most ``READ_TIMEOUT_S``: then its statement is
interrupted and its connection returned. A write waits at most ``WRITE_TIMEOUT_S`` for the
database's write lock while another process holds it.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from loraplex.errors import RegistryUnavailableError
from loraplex.registry.sql.db import Row
from loraplex.registry.sql.seats import Seats, unnested
from loraplex.registry.sql.watchdog import Watchdog

BUSY_TIMEOUT_S = 30.0
_UNIQUE_ERRORS = frozenset({"SQLITE_CONSTRAINT_PRIMARYKEY", "SQLITE_CONSTRAINT_UNIQUE"})
# Read-only connections one process opens at most (besides its one write connection), opened as
# concurrent reads need them and kept open (a file handle each, no server to spare).
READ_CONNECTIONS = 4
MAX_READ_CONNECTIONS = 64
# How long one read transaction may run statements (from its BEGIN) before the one running is
# interrupted (``sqlite3_interrupt``, from the watchdog's thread): a runaway read gives its read
# connection back instead of holding it while tenants' lookups wait for one.
READ_TIMEOUT_S = 10.0
# How long a write waits for the database's write lock while another process (another server,
# a CLI command, anything with the file open) holds it: the write connection's busy timeout.
# Then the write fails with ``RegistryUnavailableError`` (a 503). NOTE: it waited
# ``BUSY_TIMEOUT_S`` and then raised the bare "database is locked" (a 500 in the API).
WRITE_TIMEOUT_S = 10.0
# Connections a forked child's ``close`` left open (never closed there: SQLite's rule), kept
# referenced so that dropping the database does not close them either. NOTE: an interpreter
# shutdown in the child still would; a forked child ends with ``os._exit`` (as multiprocessing's
# fork children do).
_LEFT_TO_PARENT: list[sqlite3.Connection] = []


class _SqliteTx:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[object] = ()) -> None:
        self._conn.execute(sql, tuple(params))

    def query(self, sql: str, params: Sequence[object] = ()) -> list[Row]:
        return list(self._conn.execute(sql, tuple(params)).fetchall())

    def query_one(self, sql: str, params: Sequence[object] = ()) -> Row | None:
        row: Row | None = self._conn.execute(sql, tuple(params)).fetchone()
        return row


class SqliteDatabase:
    """The default registry database.

    One write connection, its transactions taking turns (``BEGIN IMMEDIATE``: other processes'
    writes wait too), and at most ``read_connections`` read-only ones (``PRAGMA query_only``: a
    write in a read transaction is refused), each used by one transaction at a time (one opened
    at start, the others as concurrent reads need them). Reads other than tenant requests'
    (``serving``) hold at most all but ``seats.SERVING_RESERVE`` of them. A call finding its
    turn taken, or every read connection it may take busy, for ``wait_s`` fails with
    ``RegistryUnavailableError``, as does a read transaction still running a statement
    ``read_timeout_s`` after it began (the statement is interrupted), and a write finding the
    write lock held by another process for ``write_timeout_s``. Transactions do not nest (a
    nested read would not see the enclosing write's rows).

    NOTE: not usable across a fork (SQLite's rule: its locks are per process, so a child using,
    or even closing, an inherited connection may corrupt the file the parent still writes). No
    path forks with one open: ``serve`` forks its engine child before it opens the registry, and
    every other child is spawned or exec'd; a child calling anyway is refused, never served, and
    its ``close`` leaves the connections open (SQLite: ``sqlite3_close`` in a child may clean up
    content from under the parent).
    """

    def __init__(
        self,
        path: str,
        read_connections: int = READ_CONNECTIONS,
        wait_s: float = BUSY_TIMEOUT_S,
        read_timeout_s: float = READ_TIMEOUT_S,
        write_timeout_s: float = WRITE_TIMEOUT_S,
    ) -> None:
        if not 1 <= read_connections <= MAX_READ_CONNECTIONS:
            raise ValueError(
                f"read_connections {read_connections!r} is invalid; expected 1 to "
                f"{MAX_READ_CONNECTIONS}"
            )
        if not 0 < wait_s <= BUSY_TIMEOUT_S:
            raise ValueError(f"wait_s {wait_s!r} is invalid; expected > 0, <= {BUSY_TIMEOUT_S:g}")
        if not 0 < read_timeout_s <= READ_TIMEOUT_S:
            raise ValueError(
                f"read_timeout_s {read_timeout_s!r} is invalid; expected > 0, <= {READ_TIMEOUT_S:g}"
            )
        if not 0 < write_timeout_s <= WRITE_TIMEOUT_S:
            raise ValueError(
                f"write_timeout_s {write_timeout_s!r} is invalid; expected > 0, <= "
                f"{WRITE_TIMEOUT_S:g}"
            )
        if path == ":memory:":
            raise ValueError(
                f"database url {'sqlite:///' + path!r} is invalid; expected sqlite:///PATH of a "
                "file (an in-memory database is one per connection: readers would not see the "
                "writer's rows)"
            )
        self._path = Path(path)
        self._path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Owner-only from the start (SQLite gives its -wal and -shm files the same mode).
        os.close(os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600))
        self._wait_s = wait_s
        self._read_timeout_s = read_timeout_s
        self._write_timeout_s = write_timeout_s
        self._conn = self._connect(write_timeout_s)
        (mode,) = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()
        if str(mode).lower() != "wal":
            self._conn.close()
            raise ValueError(
                f"database url {self.url!r} is invalid: its journal mode stays {mode!r}, not "
                "WAL (a filesystem without shared memory?), and its readers would block its "
                "writer"
            )
        # FULL: a committed registration survives power loss, not only a process crash.
        self._conn.execute("PRAGMA synchronous = FULL")
        self._conn.execute("PRAGMA foreign_keys = ON")
        self._write_lock = threading.Lock()
        self._seats: Seats[sqlite3.Connection] = Seats(read_connections, "read connections")
        self._cond = self._seats.cond
        # one read connection from the start: every read finds an idle one until reads overlap
        # (a tenant's first lookup runs the code its next ones run)
        self._readers: list[sqlite3.Connection] = [self._connect_reader()]  # every one opened
        self._seats.idle.extend(self._readers)
        self._closed = False
        self._local = threading.local()  # .active: this thread is in a transaction
        self._pid = os.getpid()  # the process that opened the connections
        self._watchdog = Watchdog(read_timeout_s)  # interrupts reads past their time
        self._watchdog.start()

    @property
    def dialect(self) -> str:
        return "sqlite"

    @property
    def url(self) -> str:
        return f"sqlite:///{self._path}"

    def _connect(self, busy_s: float) -> sqlite3.Connection:
        """A connection waiting at most ``busy_s`` for a lock another process holds."""
        conn = sqlite3.connect(
            self._path, timeout=busy_s, isolation_level=None, check_same_thread=False
        )
        conn.execute(f"PRAGMA busy_timeout = {max(1, int(busy_s * 1000))}")
        return conn

    def _connect_reader(self) -> sqlite3.Connection:
        conn = self._connect(BUSY_TIMEOUT_S)
        try:
            conn.execute("PRAGMA query_only = ON")
        except BaseException:
            conn.close()
            raise
        return conn

    @contextmanager
    def transaction(self, write: bool = True, serving: bool = False) -> Iterator[_SqliteTx]:
        """A write on the write connection, in turn; a read on a read connection (``serving``:
        one the other reads leave free)."""
        if os.getpid() != self._pid:
            raise RuntimeError(
                f"the registry database {self.url} was opened by process {self._pid}; a forked "
                "child must open its own"
            )
        with unnested(self._local):
            if write:
                with self._write_turn(), self._begun(self._conn, "BEGIN IMMEDIATE") as tx:
                    yield tx
                return
            conn = self._checkout(serving)
            try:
                with self._bounded(conn), self._begun(conn, "BEGIN") as tx:
                    yield tx
            finally:
                self._checkin(conn, serving)

    @contextmanager
    def _bounded(self, conn: sqlite3.Connection) -> Iterator[None]:
        """The read on ``conn`` has its running statement interrupted ``read_timeout_s`` after
        it began; the interrupted statement's error becomes ``RegistryUnavailableError``."""
        with self._watchdog.calling(conn.interrupt) as watch:
            try:
                yield
            except sqlite3.OperationalError as exc:
                if watch.fired and exc.sqlite_errorname == "SQLITE_INTERRUPT":
                    raise RegistryUnavailableError(
                        f"a read went on for {self._read_timeout_s:g} s"
                    ) from exc
                raise

    @contextmanager
    def _begun(self, conn: sqlite3.Connection, begin: str) -> Iterator[_SqliteTx]:
        """A transaction on ``conn``. ``BEGIN IMMEDIATE`` takes the write lock, waiting
        ``write_timeout_s`` at most (the write connection's busy timeout) while another process
        holds it; a read's ``BEGIN`` takes no lock."""
        try:
            conn.execute(begin)
        except sqlite3.OperationalError as exc:
            if not exc.sqlite_errorname.startswith("SQLITE_BUSY"):
                raise
            raise RegistryUnavailableError(
                f"another process held its write lock for {self._write_timeout_s:g} s"
            ) from exc
        try:
            yield _SqliteTx(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @contextmanager
    def _write_turn(self) -> Iterator[None]:
        if not self._write_lock.acquire(timeout=self._wait_s):
            raise RegistryUnavailableError(
                f"another write in this process went on for {self._wait_s:g} s"
            )
        try:
            if self._closed:
                raise RegistryUnavailableError("it was closed")
            yield
        finally:
            self._write_lock.release()

    def _checkout(self, serving: bool) -> sqlite3.Connection:
        """An idle read connection, else a new one while there is room, else the first one
        returned within ``wait_s``; not ``serving``: only while other such reads hold fewer
        than their share."""
        conn = self._seats.take(
            serving, self._wait_s, lambda: len(self._readers), lambda: self._closed
        )
        if conn is not None:
            return conn
        try:
            conn = self._connect_reader()
        except BaseException:
            self._seats.open_failed(serving)
            raise
        with self._cond:
            self._seats.opening -= 1
            self._readers.append(conn)
        return conn

    def _checkin(self, conn: sqlite3.Connection, serving: bool) -> None:
        """Back to the idle ones; closed instead once the database is closed, or when left in
        a transaction (a failed ``COMMIT``: its next ``BEGIN`` would fail).

        NOTE: every waiter is woken (not one): a waiter for the other share may be unable to
        take what was freed, and a single wake-up spent on it would leave the able one waiting.
        """
        with self._cond:
            self._seats.returned(serving)
            self._cond.notify_all()
            if not self._closed and not conn.in_transaction:
                self._seats.idle.append(conn)
                return
            self._readers.remove(conn)
        conn.close()

    def is_unique_violation(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.IntegrityError) and exc.sqlite_errorname in _UNIQUE_ERRORS

    def close(self) -> None:
        """Closes the idle connections at once, the busy ones as their transactions end; in a
        forked child, none (they are the parent's: kept open, ``_LEFT_TO_PARENT``)."""
        if os.getpid() != self._pid:
            # NOTE: no lock taken either: a thread of the parent may have held it at the fork
            _LEFT_TO_PARENT.extend([self._conn, *self._readers])
            return
        self._watchdog.stop()
        with self._cond:
            self._closed = True
            idle, self._seats.idle = self._seats.idle, []
            for conn in idle:
                self._readers.remove(conn)
            self._cond.notify_all()
        for conn in idle:
            conn.close()
        with self._write_lock:
            self._conn.close()
