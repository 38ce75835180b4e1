"""SQLite engine: one file in the data directory, WAL mode, safe with several local processes.

WAL lets readers proceed while one writer commits; ``BEGIN IMMEDIATE`` takes the write lock at
the start of a write transaction, so two processes never interleave read-check-write sequences
(the loser waits up to the busy timeout instead of failing half-way).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from loraplex.registry.sql.db import Row

BUSY_TIMEOUT_S = 30.0
_UNIQUE_ERRORS = frozenset({"SQLITE_CONSTRAINT_PRIMARYKEY", "SQLITE_CONSTRAINT_UNIQUE"})


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

    NOTE: not usable across a fork (SQLite's rule: its locks are per process, so a child using,
    or even closing, an inherited connection may corrupt the file the parent still writes). No
    path forks with one open: ``serve`` forks its engine child before it opens the registry, and
    every other child is spawned or exec'd; a child calling anyway is refused, never served.
    """

    def __init__(self, path: str) -> None:
        self._path = Path(path)
        self._path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Owner-only from the start (SQLite gives its -wal and -shm files the same mode).
        os.close(os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600))
        self._conn = sqlite3.connect(
            self._path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        self._conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        self._conn.execute("PRAGMA journal_mode = WAL")
        # FULL: a committed registration survives power loss, not only a process crash.
        self._conn.execute("PRAGMA synchronous = FULL")
        self._conn.execute("PRAGMA foreign_keys = ON")
        self._lock = threading.RLock()
        self._pid = os.getpid()  # the process that opened the connection

    @property
    def dialect(self) -> str:
        return "sqlite"

    @property
    def url(self) -> str:
        return f"sqlite:///{self._path}"

    @contextmanager
    def transaction(self, write: bool = True, serving: bool = False) -> Iterator[_SqliteTx]:
        """``serving`` changes nothing: one connection, taken in turn (no pool to reserve)."""
        if os.getpid() != self._pid:
            raise RuntimeError(
                f"the registry database {self.url} was opened by process {self._pid}; a forked "
                "child must open its own"
            )
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield _SqliteTx(self._conn)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def is_unique_violation(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.IntegrityError) and exc.sqlite_errorname in _UNIQUE_ERRORS

    def close(self) -> None:
        self._conn.close()
