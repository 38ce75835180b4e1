"""PostgreSQL engine: the registry shared by several machines.

Write transactions take one transaction-scoped advisory lock, the PostgreSQL counterpart of
SQLite's ``BEGIN IMMEDIATE``: administrative writes are rare, and serialising them keeps every
read-check-write sequence correct under READ COMMITTED without per-table locking.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import psycopg
import psycopg.errors

from loraplex.registry.sql.db import Row

# Arbitrary constant naming "the loraplex registry write lock" among advisory locks.
_WRITE_LOCK_KEY = 0x6C70785F726567


class _PostgresTx:
    def __init__(self, conn: psycopg.Connection[Row]) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[object] = ()) -> None:
        self._conn.execute(_placeholders(sql), tuple(params) or None)

    def query(self, sql: str, params: Sequence[object] = ()) -> list[Row]:
        return self._conn.execute(_placeholders(sql), tuple(params) or None).fetchall()

    def query_one(self, sql: str, params: Sequence[object] = ()) -> Row | None:
        return self._conn.execute(_placeholders(sql), tuple(params) or None).fetchone()


class PostgresDatabase:
    """A registry database on a PostgreSQL server (``postgresql://`` URL, libpq syntax)."""

    def __init__(self, url: str) -> None:
        self._conn: psycopg.Connection[Row] = psycopg.connect(url, autocommit=True)
        self._lock = threading.RLock()

    @property
    def dialect(self) -> str:
        return "postgres"

    @property
    def url(self) -> str:
        return (
            f"postgresql://{self._conn.info.host}:{self._conn.info.port}/{self._conn.info.dbname}"
        )

    @contextmanager
    def transaction(self, write: bool = True) -> Iterator[_PostgresTx]:
        with self._lock, self._conn.transaction():
            tx = _PostgresTx(self._conn)
            if write:
                tx.execute("SELECT pg_advisory_xact_lock(?)", (_WRITE_LOCK_KEY,))
            yield tx

    def is_unique_violation(self, exc: BaseException) -> bool:
        return isinstance(exc, psycopg.errors.UniqueViolation)

    def close(self) -> None:
        self._conn.close()


def _placeholders(sql: str) -> str:
    """Registry SQL uses ``?``; psycopg wants ``%s`` (and never sees a literal ``%``)."""
    return sql.replace("?", "%s")
