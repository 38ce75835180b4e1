"""A SQLite registry is never used across a fork: a child calling it is refused (its locks are
per process: a child's use of the inherited connection could corrupt the parent's file), and the
parent's connection goes on."""

from __future__ import annotations

import os
import select
from pathlib import Path

from loraplex.registry.sql.sqlite import SqliteDatabase

HANG_BOUND_S = 20.0


def test_a_forked_child_is_refused_and_the_parent_goes_on(tmp_path: Path) -> None:
    db = SqliteDatabase(str(tmp_path / "registry.db"))
    with db.transaction() as tx:
        tx.execute("CREATE TABLE t (v INTEGER)")
    out_r, out_w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            with db.transaction() as tx:
                tx.execute("INSERT INTO t VALUES (2)")
            os.write(out_w, b"served")
        except BaseException as exc:  # reported to the parent
            os.write(out_w, str(exc).encode())
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
    assert report == (
        f"the registry database {db.url} was opened by process {os.getpid()}; a forked child "
        "must open its own"
    )
    with db.transaction() as tx:
        tx.execute("INSERT INTO t VALUES (1)")
    with db.transaction(write=False) as tx:
        assert tx.query("SELECT v FROM t") == [(1,)]
    db.close()
