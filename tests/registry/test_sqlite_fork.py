"""A SQLite registry is never used across a fork: a child calling it is refused (its locks are
per process: a child's use of the inherited connection could corrupt the parent's file), its
``close`` leaves the connections alone, and the parent's connections go on."""

from __future__ import annotations

import os
import select
from collections.abc import Callable
from pathlib import Path

from loraplex.registry.sql.sqlite import SqliteDatabase

HANG_BOUND_S = 20.0


def _in_child(call: Callable[[], str]) -> str:
    """What ``call`` returned (or the error it raised, as text) in a forked child."""
    out_r, out_w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.write(out_w, call().encode())
        except BaseException as exc:  # reported to the parent
            os.write(out_w, f"{type(exc).__name__}: {exc}".encode())
        finally:
            os._exit(0)
    try:
        readable, _, _ = select.select([out_r], [], [], HANG_BOUND_S)
        report = os.read(out_r, 4096).decode() if readable else ""
    finally:
        if not report:
            os.kill(child, 9)
        os.waitpid(child, 0)
        os.close(out_r)
        os.close(out_w)
    return report


def _created(tmp_path: Path) -> SqliteDatabase:
    db = SqliteDatabase(str(tmp_path / "registry.db"))
    with db.transaction() as tx:
        tx.execute("CREATE TABLE t (v INTEGER)")
    with db.transaction(write=False) as tx:
        tx.query_one("SELECT 1")  # a read connection opened, then idle
    return db


def _parent_goes_on(db: SqliteDatabase) -> None:
    with db.transaction() as tx:
        tx.execute("INSERT INTO t VALUES (1)")
    with db.transaction(write=False) as tx:
        assert tx.query("SELECT v FROM t") == [(1,)]
    db.close()


def test_a_forked_child_is_refused_and_the_parent_goes_on(tmp_path: Path) -> None:
    db = _created(tmp_path)

    def _write() -> str:
        with db.transaction() as tx:
            tx.execute("INSERT INTO t VALUES (2)")
        return "served"

    assert _in_child(_write) == (
        f"RuntimeError: the registry database {db.url} was opened by process {os.getpid()}; "
        "a forked child must open its own"
    )
    _parent_goes_on(db)


def test_a_forked_childs_close_leaves_the_parents_connections_open(tmp_path: Path) -> None:
    """SQLite: ``sqlite3_close`` in a child on a connection the parent opened may clean up
    content from under the parent. On main the child's ``close`` closed its copies of every
    connection (a closed one refuses even ``total_changes``, which reads no file)."""
    db = _created(tmp_path)

    def _close() -> str:
        db.close()
        left = [db._conn, *db._readers]  # what close left
        for conn in left:
            _ = conn.total_changes  # ProgrammingError once closed
        return f"left {len(left)} open"

    assert _in_child(_close) == "left 2 open"
    _parent_goes_on(db)
