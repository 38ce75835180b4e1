"""Open the registry's database from its URL (the one place that picks the backend)."""

from __future__ import annotations

from loraplex.registry.sql.db import Database
from loraplex.registry.sql.timeouts import DatabaseTimeouts

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def open_database(
    url: str, timeouts: DatabaseTimeouts | None = None, pool_size: int | None = None
) -> Database:
    """``sqlite:///path/to/file`` or ``postgresql://user@host:port/db``; ``timeouts`` bound
    every wait on a PostgreSQL server and ``pool_size`` its connections (None: the defaults).
    A SQLite file waits up to its busy timeout for another process's write lock, on one write
    connection and a few read connections of its own (``sqlite.READ_CONNECTIONS``), and takes
    neither."""
    if url.startswith("sqlite:///"):
        if timeouts is not None:
            raise ValueError(
                f"database timeouts are invalid with {url!r}; expected a postgresql:// url"
            )
        if pool_size is not None:
            raise ValueError(
                f"database_pool_size is invalid with {url!r}; expected a postgresql:// url"
            )
        from loraplex.registry.sql.sqlite import SqliteDatabase

        return SqliteDatabase(url.removeprefix("sqlite:///"))
    if url.startswith(POSTGRES_SCHEMES):
        from loraplex.registry.sql.postgres import PostgresDatabase

        return PostgresDatabase(url, timeouts, pool_size)
    raise ValueError(
        f"database url {url!r} is invalid; expected sqlite:///PATH or postgresql://..."
    )
