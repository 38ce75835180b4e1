"""Open the registry's database from its URL (the one place that picks the backend)."""

from __future__ import annotations

from loraplex.registry.sql.db import Database


def open_database(url: str) -> Database:
    """``sqlite:///path/to/file`` or ``postgresql://user@host:port/db``."""
    if url.startswith("sqlite:///"):
        from loraplex.registry.sql.sqlite import SqliteDatabase

        return SqliteDatabase(url.removeprefix("sqlite:///"))
    if url.startswith(("postgresql://", "postgres://")):
        from loraplex.registry.sql.postgres import PostgresDatabase

        return PostgresDatabase(url)
    raise ValueError(
        f"database url {url!r} is invalid; expected sqlite:///PATH or postgresql://..."
    )
