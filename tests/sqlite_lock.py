"""A SQLite database's write lock held by another process, for the tests of what waits on it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.read()
conn.execute("ROLLBACK")
"""


@contextmanager
def write_lock_held(path: Path) -> Iterator[None]:
    """``path``'s write lock (``BEGIN IMMEDIATE``), taken by a child process before the block
    starts and held until it ends."""
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline() == "held\n", "the child took no write lock"
        yield
    finally:
        child.stdin.close()
        assert child.wait(timeout=60) == 0
