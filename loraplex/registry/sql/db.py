"""The seam between registry code and a database engine.

Registry SQL is written once, with ``?`` placeholders and portable types; an engine adapts the
placeholders, opens transactions with the right locking, and says which exceptions mean "a unique
key already exists" (so a concurrent insert can be told apart from a real failure).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

Row = tuple[Any, ...]


class Tx(Protocol):
    """An open transaction. Committed when its context exits normally, rolled back otherwise."""

    def execute(self, sql: str, params: Sequence[object] = ()) -> None: ...

    def query(self, sql: str, params: Sequence[object] = ()) -> list[Row]: ...

    def query_one(self, sql: str, params: Sequence[object] = ()) -> Row | None: ...


class Database(Protocol):
    """A connection to the registry database (implementations: SQLite, PostgreSQL)."""

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgres"``: selects engine-specific DDL in migrations."""
        ...

    @property
    def url(self) -> str:
        """Where the database is (credentials removed)."""
        ...

    def transaction(self, write: bool = True, serving: bool = False) -> AbstractContextManager[Tx]:
        """A transaction. Write transactions are serialised across every process using the
        database (registry writes are rare administrative changes; serialising them makes
        read-check-write sequences safe without per-engine row locking). ``serving``: a tenant
        request's (authentication, resolution), which may take the connection that every
        other transaction leaves free (PostgreSQL: of its pool; SQLite: of its read
        connections, its writes taking turns on one more)."""
        ...

    def is_unique_violation(self, exc: BaseException) -> bool:
        """Whether ``exc`` means a primary-key/unique constraint refused an insert."""
        ...

    def close(self) -> None: ...
