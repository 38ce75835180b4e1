"""A write to a SQLite registry whose write lock another process holds gives up after
``write_timeout_s`` with ``RegistryUnavailableError`` (a 503 in the API); the lock is a real
one, taken by a child process (``sqlite_lock.write_lock_held``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlite_lock import write_lock_held

from loraplex.errors import RegistryUnavailableError
from loraplex.registry.sql.sqlite import SqliteDatabase


def test_a_write_behind_another_process_lock_gives_up_and_the_next_one_writes(
    tmp_path: Path,
) -> None:
    """NOTE: it waited 30 s (``BUSY_TIMEOUT_S``), then raised sqlite3's bare "database is
    locked" (an internal error, a 500, in the API)."""
    path = tmp_path / "registry.db"
    db = SqliteDatabase(str(path), write_timeout_s=0.2)
    with db.transaction() as tx:
        tx.execute("CREATE TABLE t (x INTEGER)")
    with write_lock_held(path):
        with pytest.raises(RegistryUnavailableError) as caught, db.transaction() as tx:
            tx.execute("INSERT INTO t VALUES (1)")
        assert caught.value.reason == "another process held its write lock for 0.2 s"
        with db.transaction(write=False) as tx:  # reads go on beside the lock
            assert tx.query_one("SELECT count(*) FROM t") == (0,)
    with db.transaction() as tx:  # the lock released: the write connection writes again
        tx.execute("INSERT INTO t VALUES (2)")
    with db.transaction(write=False) as tx:
        assert tx.query("SELECT x FROM t") == [(2,)]
    db.close()
