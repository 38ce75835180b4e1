"""A PostgreSQL registry's connections (``database_pool_size``), against the real local server:
a statement waiting on the server (a lock held by another client, as a slow listing or a long
write would) holds up no other call of the same process, tenants' or administrators'; each of
the pool's connections carries the configured limits; the pool is bounded; writes of one process
queue on the process, not on the server's lock timeout; and a forked child opens its own
connections, never the parent's, with its own watchdog.

Ordering and completion are asserted (events, the server's own lock table), never durations;
waits are bounded far above every limit so that a hang fails instead of blocking the run.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from test_postgres_timeouts import FAST, HANG_BOUND_S, _backend_pid, _registry, _Relay

from loraplex.errors import RegistryUnavailableError
from loraplex.registry import Registry, RegistryConfig, open_registry
from loraplex.registry.sql.connect import open_database
from loraplex.registry.sql.db import Database
from loraplex.registry.sql.timeouts import DatabaseTimeouts

# A lock wait far longer than anything the other calls of a test do (the waiting call must
# still be waiting when they end, however busy the machine); a hang still fails at the limit.
PATIENT = DatabaseTimeouts(connect_timeout_s=2, statement_timeout_s=15.0, lock_timeout_s=15.0)


@pytest.fixture
def pg_registry(tmp_path: Path, postgres_url: str) -> Iterator[Registry]:
    registry = _registry(tmp_path, postgres_url, PATIENT)
    registry.create_tenant("acme", actor="test")
    yield registry
    registry.close()


def _in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """``call`` started on a thread; its outcome (result or exception) lands in the list."""
    outcome: list[object] = []

    def _run() -> None:
        try:
            outcome.append(call())
        except Exception as exc:  # the test inspects it
            outcome.append(exc)

    thread = threading.Thread(target=_run, daemon=True)
    thread.start()
    return thread, outcome


def _wait_until_blocked_by(url: str, holder_pid: int) -> None:
    """Returns once some backend waits for a lock ``holder_pid`` holds (the server says so)."""
    with psycopg.connect(url, autocommit=True) as watcher:
        for _ in range(int(HANG_BOUND_S / 0.02)):
            row = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                (holder_pid,),
            ).fetchone()
            if row is not None and row[0] > 0:
                return
            threading.Event().wait(0.02)
    pytest.fail("no call ever waited for the lock")


def test_a_call_waiting_on_a_lock_holds_up_no_other_call_of_the_process(
    pg_registry: Registry, postgres_url: str
) -> None:
    key = pg_registry.create_key("acme", actor="test")
    with psycopg.connect(postgres_url) as other:  # a transaction, held until the block ends
        other.execute("LOCK TABLE adapters IN ACCESS EXCLUSIVE MODE")
        holder = other.info.backend_pid
        listing, listed = _in_thread(pg_registry.list_adapters)  # an admin listing: waits
        _wait_until_blocked_by(postgres_url, holder)
        # while it waits: a tenant's authentication, the readiness probe, other admin reads
        # and an admin write, all on the same registry (one process)
        assert pg_registry.authenticate(key.token).name == "acme"
        pg_registry.ping()
        assert [k.key_id for k in pg_registry.list_keys("acme")] == [key.key_id]
        assert pg_registry.create_tenant("beta", actor="test").name == "beta"
        assert listed == []  # the listing still waits: nothing failed it to make room
        assert listing.is_alive()
    listing.join(HANG_BOUND_S)
    assert listed == [[]]  # and it completes once the lock is gone


def test_every_connection_carries_the_limits(postgres_url: str) -> None:
    db = open_database(postgres_url, DatabaseTimeouts(3, 2.5, 0.25), pool_size=3)
    try:
        inside, release = threading.Barrier(3), threading.Event()

        def _settings() -> tuple[object, ...]:
            with db.transaction(write=False) as tx:
                row = tx.query_one(
                    "SELECT pg_backend_pid(), current_setting('statement_timeout'), "
                    "current_setting('lock_timeout')"
                )
                inside.wait(HANG_BOUND_S)  # all three transactions open at once
                release.wait(HANG_BOUND_S)
            assert row is not None
            return row

        started = [_in_thread(_settings) for _ in range(3)]
        release.set()
        for thread, _ in started:
            thread.join(HANG_BOUND_S)
        rows = [outcome[0] for _, outcome in started]
        assert all(isinstance(row, tuple) for row in rows), rows
        assert len({row[0] for row in rows}) == 3  # type: ignore[index]  # three connections
        assert {row[1:] for row in rows} == {("2500ms", "250ms")}  # type: ignore[index]
    finally:
        db.close()


def test_the_pool_is_bounded(postgres_url: str) -> None:
    db = open_database(postgres_url, FAST, pool_size=2)
    holding = threading.Barrier(3)
    release = threading.Event()

    def _hold() -> int:
        with db.transaction(write=False) as tx:
            row = tx.query_one("SELECT pg_backend_pid()")
            holding.wait(HANG_BOUND_S)
            release.wait(HANG_BOUND_S)
        assert row is not None
        return int(row[0])

    holders = [_in_thread(_hold) for _ in range(2)]
    try:
        holding.wait(HANG_BOUND_S)  # both connections taken
        with pytest.raises(RegistryUnavailableError) as caught:
            _backend_pid(db)
        assert caught.value.reason == f"its 2 connections stayed busy for {FAST.client_wait_s:g} s"
    finally:
        release.set()
        for thread, _ in holders:
            thread.join(HANG_BOUND_S)
    _backend_pid(db)  # free again
    db.close()


def test_writes_of_one_process_queue_in_the_process_not_on_the_lock_timeout(
    postgres_url: str,
) -> None:
    # FAST's lock timeout (0.3 s) is far shorter than the first write is held open: a second
    # write waiting on the server's advisory lock would fail; waiting in the process it does not
    db = open_database(postgres_url, FAST, pool_size=2)
    try:
        with db.transaction() as tx:
            tx.execute("CREATE TABLE t (v INTEGER)")
        writing, release = threading.Event(), threading.Event()

        def _first() -> None:
            with db.transaction() as tx:
                tx.execute("INSERT INTO t VALUES (1)")
                writing.set()
                release.wait(HANG_BOUND_S)

        def _second() -> None:
            with db.transaction() as tx:
                tx.execute("INSERT INTO t VALUES (2)")

        first, first_outcome = _in_thread(_first)
        assert writing.wait(HANG_BOUND_S)
        second, second_outcome = _in_thread(_second)
        second.join(FAST.lock_timeout_s * 4)  # past the lock timeout, still waiting
        assert second_outcome == []
        with db.transaction(write=False) as tx:  # a read goes on meanwhile
            assert tx.query("SELECT v FROM t") == []
        release.set()
        first.join(HANG_BOUND_S)
        second.join(HANG_BOUND_S)
        assert first_outcome == [None] and second_outcome == [None]
        with db.transaction(write=False) as tx:
            assert tx.query("SELECT v FROM t ORDER BY v") == [(1,), (2,)]
    finally:
        db.close()


def test_a_write_queued_past_the_wait_limit_fails_alone(postgres_url: str) -> None:
    db = open_database(postgres_url, FAST, pool_size=2)
    try:
        writing, release = threading.Event(), threading.Event()

        def _stuck_write() -> None:
            with db.transaction():
                writing.set()
                release.wait(HANG_BOUND_S)  # a writer stuck inside its transaction

        stuck, stuck_outcome = _in_thread(_stuck_write)
        assert writing.wait(HANG_BOUND_S)
        try:
            with pytest.raises(RegistryUnavailableError) as caught, db.transaction():
                pass
            reason = f"another write in this process went on for {FAST.client_wait_s:g} s"
            assert caught.value.reason == reason
            _backend_pid(db)  # reads go on meanwhile
        finally:
            release.set()
            stuck.join(HANG_BOUND_S)
        # the stuck one was given up by the watchdog (idle in its transaction past the limit)
        assert [getattr(e, "reason", e) for e in stuck_outcome] == [
            f"no answer within {FAST.client_wait_s:g} s"
        ]
        with db.transaction():  # the queue is free again
            pass
    finally:
        db.close()


def _child_run(db: Database, ready_w: int, go_r: int, out_w: int) -> None:
    """In a forked child: one call, tell the parent, wait for the relay to freeze, one more
    call; its outcome (the child's first backend pid and the second call's result) to the
    parent."""
    first = _backend_pid(db)
    os.write(ready_w, b"r")
    os.read(go_r, 1)
    try:
        result = str(_backend_pid(db))
    except RegistryUnavailableError as exc:
        result = exc.reason
    os.write(out_w, f"{first}|{result}".encode())


def _read_within(fd: int, bound_s: float) -> bytes:
    readable, _, _ = select.select([fd], [], [], bound_s)
    return os.read(fd, 4096) if readable else b""


def test_a_forked_child_uses_its_own_connections_watched_by_its_own_watchdog(
    postgres_url: str,
) -> None:
    parts = urlsplit(postgres_url)
    with _Relay(parts.port or 5432) as relay:
        via_relay = urlunsplit(parts._replace(netloc=f"postgres@127.0.0.1:{relay.port}"))
        db = open_database(via_relay, FAST)
        parent_pid = _backend_pid(db)  # the parent's connection and watchdog thread exist
        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe()
        out_r, out_w = os.pipe()
        report = ""
        child = os.fork()
        if child == 0:  # pragma: no cover - the child reports through the pipe
            try:
                _child_run(db, ready_w, go_r, out_w)
            except BaseException as exc:  # reported to the parent
                os.write(out_w, f"error|{exc!r}".encode())
            finally:
                os._exit(0)
        try:
            assert _read_within(ready_r, HANG_BOUND_S) == b"r"
            relay.frozen.set()  # the server goes silent for every connection through the relay
            os.write(go_w, b"g")
            report = _read_within(out_r, HANG_BOUND_S).decode()
            relay.frozen.clear()
        finally:
            if not report:  # a hung child: the parent's bound passed
                os.kill(child, 9)
            os.waitpid(child, 0)
            for fd in (ready_r, ready_w, go_r, go_w, out_r, out_w):
                os.close(fd)
        child_first, second = report.split("|", 1)
        assert child_first != str(parent_pid)  # not the parent's connection
        assert second == f"no answer within {FAST.client_wait_s:g} s"  # the child's watchdog
        assert _backend_pid(db) == parent_pid  # the parent's connection is untouched
        db.close()


def test_the_configured_pool_size_reaches_the_database(tmp_path: Path, postgres_url: str) -> None:
    registry = open_registry(RegistryConfig(tmp_path / "data", postgres_url, database_pool_size=2))
    try:
        assert getattr(registry.db, "pool_size", None) == 2
    finally:
        registry.close()
