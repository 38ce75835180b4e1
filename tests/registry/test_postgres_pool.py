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
from loraplex.registry.sql.postgres import PostgresDatabase
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


def _wait_until_blocked_by(
    url: str, holder_pid: int, count: int = 1, bound_s: float = HANG_BOUND_S
) -> bool:
    """Returns once ``count`` backends wait for a lock ``holder_pid`` holds (the server says
    so); fails the test when none ever does, else False when fewer did within ``bound_s``."""
    seen = 0
    with psycopg.connect(url, autocommit=True) as watcher:
        for _ in range(int(bound_s / 0.02)):
            row = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                (holder_pid,),
            ).fetchone()
            seen = 0 if row is None else int(row[0])
            if seen >= count:
                return True
            threading.Event().wait(0.02)
    if seen == 0:
        pytest.fail("no call ever waited for the lock")
    return False


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


def test_administrators_calls_waiting_on_the_server_leave_a_connection_to_tenants(
    tmp_path: Path, postgres_url: str
) -> None:
    """As many blocked admin listings as the pool has connections: on main they took all four
    and a tenant's authentication waited until the server failed one of them (its lock
    timeout); now they hold three, the fourth waits in the process, and the authentication
    takes the connection kept for tenant requests."""
    registry = open_registry(
        RegistryConfig(
            tmp_path / "data",
            postgres_url,
            database_connect_timeout_s=PATIENT.connect_timeout_s,
            database_statement_timeout_s=PATIENT.statement_timeout_s,
            database_lock_timeout_s=PATIENT.lock_timeout_s,
            database_pool_size=4,
        )
    )
    try:
        registry.create_tenant("acme", actor="test")
        key = registry.create_key("acme", actor="test")
        with psycopg.connect(postgres_url) as other:
            other.execute("LOCK TABLE adapters IN ACCESS EXCLUSIVE MODE")
            holder = other.info.backend_pid
            listings = [_in_thread(registry.list_adapters) for _ in range(4)]
            assert _wait_until_blocked_by(postgres_url, holder, count=3)
            # main: the fourth blocks on the server too (at once); now it waits in the process
            _wait_until_blocked_by(postgres_url, holder, count=4, bound_s=1.0)
            assert registry.authenticate(key.token).name == "acme"
            assert [outcome for _, outcome in listings] == [[], [], [], []]  # none failed
            assert all(thread.is_alive() for thread, _ in listings)
        for thread, _ in listings:
            thread.join(HANG_BOUND_S)
        assert [outcome for _, outcome in listings] == [[[]], [[]], [[]], [[]]]
    finally:
        registry.close()


def test_calls_other_than_tenant_requests_hold_all_but_one_connection(postgres_url: str) -> None:
    db = open_database(postgres_url, FAST, pool_size=2)
    holding, release = threading.Event(), threading.Event()

    def _hold() -> None:
        with db.transaction(write=False):
            holding.set()
            release.wait(HANG_BOUND_S)

    holder, outcome = _in_thread(_hold)
    try:
        assert holding.wait(HANG_BOUND_S)
        with pytest.raises(RegistryUnavailableError) as caught, db.transaction(write=False):
            pass
        assert caught.value.reason == (
            "the 1 of its 2 connections that calls other than tenant requests may hold stayed "
            f"busy for {FAST.client_wait_s:g} s"
        )
        _backend_pid_serving(db)  # a tenant request's still gets one
    finally:
        release.set()
        holder.join(HANG_BOUND_S)
    # the holder, idle in its transaction as long as the wait, may have been given up
    (held,) = outcome
    assert held is None or getattr(held, "reason", held) == (
        f"no answer within {FAST.client_wait_s:g} s"
    )
    _backend_pid(db)  # the share is free again
    db.close()


def test_a_pool_of_one_serves_every_call(postgres_url: str) -> None:
    db = open_database(postgres_url, FAST, pool_size=1)
    try:
        _backend_pid(db)
        _backend_pid_serving(db)
    finally:
        db.close()


def _backend_pid_serving(db: Database) -> int:
    with db.transaction(write=False, serving=True) as tx:
        row = tx.query_one("SELECT pg_backend_pid()")
    assert row is not None
    return int(row[0])


def _alive_backends(url: str, pids: set[int]) -> set[int]:
    with psycopg.connect(url, autocommit=True) as watcher:
        rows = watcher.execute(
            "SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", (list(pids),)
        ).fetchall()
    return {int(row[0]) for row in rows}


def test_idle_connections_past_the_bound_are_closed_but_one(postgres_url: str) -> None:
    """After a burst the pool went back to one connection (it kept all three for the life of
    the process); the server's own view says which backends are gone."""
    db = PostgresDatabase(postgres_url, FAST, pool_size=3, idle_close_s=0.3)
    try:
        inside, release = threading.Barrier(3), threading.Event()

        def _pid() -> int:
            with db.transaction(write=False, serving=True) as tx:
                row = tx.query_one("SELECT pg_backend_pid()")
                inside.wait(HANG_BOUND_S)  # three at once: three connections
                release.wait(HANG_BOUND_S)
            assert row is not None
            return int(row[0])

        burst = [_in_thread(_pid) for _ in range(3)]
        release.set()
        for thread, _ in burst:
            thread.join(HANG_BOUND_S)
        pids = {int(outcome[0]) for _, outcome in burst}  # type: ignore[call-overload]
        assert len(pids) == 3
        for _ in range(int(HANG_BOUND_S / 0.05)):
            if len(_alive_backends(postgres_url, pids)) == 1:
                break
            threading.Event().wait(0.05)
        (kept,) = _alive_backends(postgres_url, pids)
        assert _backend_pid(db) == kept  # the one kept still serves
        assert _backend_pid(db) == kept
    finally:
        db.close()


def test_a_connection_in_use_again_is_not_closed(postgres_url: str) -> None:
    db = PostgresDatabase(postgres_url, FAST, pool_size=2, idle_close_s=0.3)
    try:
        inside, release = threading.Barrier(2), threading.Event()

        def _pid() -> int:
            with db.transaction(write=False, serving=True) as tx:
                row = tx.query_one("SELECT pg_backend_pid()")
                inside.wait(HANG_BOUND_S)
                release.wait(HANG_BOUND_S)
            assert row is not None
            return int(row[0])

        burst = [_in_thread(_pid) for _ in range(2)]
        release.set()
        for thread, _ in burst:
            thread.join(HANG_BOUND_S)
        pids = {int(outcome[0]) for _, outcome in burst}  # type: ignore[call-overload]
        with db.transaction(write=False) as tx:  # held past the bound: never closed under it
            threading.Event().wait(0.9)
            row = tx.query_one("SELECT pg_backend_pid()")
        assert row is not None and int(row[0]) in pids
        for _ in range(int(HANG_BOUND_S / 0.05)):
            if len(_alive_backends(postgres_url, pids)) == 1:
                break
            threading.Event().wait(0.05)
        assert _alive_backends(postgres_url, pids) == {int(row[0])}
    finally:
        db.close()


def test_idle_close_s_is_validated(postgres_url: str) -> None:
    with pytest.raises(ValueError, match="idle_close_s 0 is invalid; expected > 0"):
        PostgresDatabase(postgres_url, FAST, idle_close_s=0)


def test_every_connection_carries_the_limits(postgres_url: str) -> None:
    db = open_database(postgres_url, DatabaseTimeouts(3, 2.5, 0.25), pool_size=3)
    try:
        inside, release = threading.Barrier(3), threading.Event()

        def _settings() -> tuple[object, ...]:
            with db.transaction(write=False, serving=True) as tx:  # may take all three
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
        with db.transaction(write=False, serving=True) as tx:  # tenant requests': all of them
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
        assert caught.value.reason == (
            "the 1 of its 2 connections that calls other than tenant requests may hold stayed "
            f"busy for {FAST.client_wait_s:g} s"
        )
        with pytest.raises(RegistryUnavailableError) as caught, db.transaction(serving=True):
            pass
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
    db = open_database(
        postgres_url, FAST, pool_size=3
    )  # the reads meanwhile: not the write's share
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
    db = open_database(
        postgres_url, FAST, pool_size=3
    )  # the reads meanwhile: not the write's share
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
