"""A PostgreSQL registry never waits without a limit, against the real local server: a row
lock another client holds fails the call at the lock timeout, a statement past the statement
timeout is cancelled, a port that never answers fails the connect timeout, and a server that
stops answering is given up. Each failure is ``RegistryUnavailableError`` for that call alone;
its transaction is rolled back, and a broken connection is replaced, never used again.

Elapsed times are checked only against bounds far above the limits (a hang would pass them
all); the reason in the error says which limit fired.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from loraplex.errors import RegistryUnavailableError
from loraplex.registry import PriorityClass, Registry, RegistryConfig, open_registry
from loraplex.registry.sql.connect import open_database
from loraplex.registry.sql.postgres import PostgresDatabase
from loraplex.registry.sql.timeouts import DatabaseTimeouts

FAST = DatabaseTimeouts(connect_timeout_s=2, statement_timeout_s=1.0, lock_timeout_s=0.3)
HANG_BOUND_S = 20.0  # far above every limit used here: only a call without a limit reaches it


def _registry(tmp_path: Path, url: str, limits: DatabaseTimeouts = FAST) -> Registry:
    config = RegistryConfig(
        tmp_path / "data",
        url,
        database_connect_timeout_s=limits.connect_timeout_s,
        database_statement_timeout_s=limits.statement_timeout_s,
        database_lock_timeout_s=limits.lock_timeout_s,
    )
    return open_registry(config)


@pytest.fixture
def pg_registry(tmp_path: Path, postgres_url: str) -> Iterator[Registry]:
    registry = _registry(tmp_path, postgres_url)
    registry.create_tenant("acme", actor="test")
    yield registry
    registry.close()


def _timed_failure(call: object) -> tuple[RegistryUnavailableError, float]:
    start = time.monotonic()
    with pytest.raises(RegistryUnavailableError) as caught:
        call()  # type: ignore[operator]
    return caught.value, time.monotonic() - start


def test_a_row_lock_held_elsewhere_fails_the_call_at_the_lock_timeout(
    pg_registry: Registry, postgres_url: str
) -> None:
    with psycopg.connect(postgres_url) as other:  # a transaction, held until the block ends
        other.execute("SELECT name FROM tenants WHERE name = 'acme' FOR UPDATE")
        error, elapsed = _timed_failure(
            lambda: pg_registry.set_tenant_limits("acme", "test", PriorityClass.HIGH)
        )
        assert error.reason == "lock timeout (0.3 s) expired"
        assert elapsed < HANG_BOUND_S
        # the call failed alone: reads, and writes elsewhere, go on while the lock is held
        assert pg_registry.get_tenant("acme").priority is PriorityClass.NORMAL
        pg_registry.create_tenant("other", actor="test")
    changed = pg_registry.set_tenant_limits("acme", "test", PriorityClass.HIGH)
    assert changed.priority is PriorityClass.HIGH


def test_a_write_stopped_half_way_is_rolled_back(pg_registry: Registry, postgres_url: str) -> None:
    # set_limits updates the tenant row, then appends its audit row: block the second step
    entries = len(pg_registry.audit_log())
    with psycopg.connect(postgres_url) as other:
        other.execute("LOCK TABLE audit_log IN EXCLUSIVE MODE")
        error, _ = _timed_failure(
            lambda: pg_registry.set_tenant_limits("acme", "test", PriorityClass.HIGH)
        )
        assert error.reason == "lock timeout (0.3 s) expired"
    assert pg_registry.get_tenant("acme").priority is PriorityClass.NORMAL
    assert len(pg_registry.audit_log()) == entries


def test_a_statement_past_the_statement_timeout_is_cancelled(postgres_url: str) -> None:
    db = open_database(postgres_url, FAST)
    try:
        with db.transaction() as tx:
            tx.execute("CREATE TABLE t (v INTEGER)")
        before = _backend_pid(db)

        def _slow_write() -> None:
            with db.transaction() as tx:
                tx.execute("INSERT INTO t VALUES (1)")
                tx.query_one("SELECT pg_sleep(5)")

        error, elapsed = _timed_failure(_slow_write)
        assert error.reason == "statement timeout (1 s) expired"
        assert elapsed < HANG_BOUND_S
        with db.transaction(write=False) as tx:
            assert tx.query("SELECT v FROM t") == []  # the insert was rolled back
        assert _backend_pid(db) == before  # a cancelled statement leaves the connection usable
    finally:
        db.close()


def test_a_port_that_never_answers_fails_the_connect_timeout(tmp_path: Path) -> None:
    with socket.socket() as blackhole:  # accepts TCP (the kernel does), never says a word
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(8)
        port = blackhole.getsockname()[1]
        url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        error, elapsed = _timed_failure(lambda: _registry(tmp_path, url))
    assert error.reason == "no connection within 2 s"
    assert elapsed < HANG_BOUND_S


def test_a_connection_killed_mid_call_is_replaced(postgres_url: str) -> None:
    db = open_database(postgres_url, DatabaseTimeouts(2, 5.0, 1.0))
    try:
        victim = _backend_pid(db)
        killer = threading.Timer(0.3, _terminate, (postgres_url, victim))
        killer.start()
        with pytest.raises(RegistryUnavailableError) as caught, db.transaction(False) as tx:
            tx.query_one("SELECT pg_sleep(3)")
        killer.join()
        assert caught.value.reason == "connection failed or lost"
        assert _backend_pid(db) != victim  # the broken connection was not used again
    finally:
        db.close()


def test_a_connection_the_server_closed_while_idle_is_replaced_before_use(
    postgres_url: str,
) -> None:
    db = open_database(postgres_url, FAST)
    try:
        victim = _backend_pid(db)
        _terminate(postgres_url, victim)
        deadline = time.monotonic() + HANG_BOUND_S
        while _backend_alive(postgres_url, victim) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _backend_pid(db) != victim  # no failed call: the dead one was noticed first
    finally:
        db.close()


def test_a_server_that_stops_answering_is_given_up(postgres_url: str) -> None:
    with _Relay(urlsplit(postgres_url).port or 5432) as relay:
        parts = urlsplit(postgres_url)
        via_relay = urlunsplit(parts._replace(netloc=f"postgres@127.0.0.1:{relay.port}"))
        db = open_database(via_relay, FAST)
        try:
            first = _backend_pid(db)
            relay.frozen.set()  # the server's bytes are held back from here: a frozen server
            error, elapsed = _timed_failure(lambda: _backend_pid(db))
            assert error.reason == f"no answer within {FAST.client_wait_s:g} s"
            assert elapsed < HANG_BOUND_S
            relay.frozen.clear()
            assert _backend_pid(db) != first  # a new connection: the given-up one is closed
        finally:
            db.close()


def test_a_closed_database_is_not_reopened(postgres_url: str) -> None:
    db = open_database(postgres_url, FAST)
    db.close()
    with pytest.raises(RegistryUnavailableError, match="closed"):
        _backend_pid(db)


def test_the_session_carries_the_configured_limits(postgres_url: str) -> None:
    db = open_database(postgres_url, DatabaseTimeouts(3, 2.5, 0.25))
    assert isinstance(db, PostgresDatabase)
    try:
        with db.transaction(write=False) as tx:
            assert tx.query_one("SELECT current_setting('statement_timeout')") == ("2500ms",)
            assert tx.query_one("SELECT current_setting('lock_timeout')") == ("250ms",)
    finally:
        db.close()


def _backend_pid(db: object) -> int:
    with db.transaction(write=False) as tx:  # type: ignore[attr-defined]
        row = tx.query_one("SELECT pg_backend_pid()")
    return int(row[0])


def _terminate(url: str, pid: int) -> None:
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


def _backend_alive(url: str, pid: int) -> bool:
    with psycopg.connect(url, autocommit=True) as admin:
        row = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))
        return bool(row.fetchone()[0])  # type: ignore[index]


class _Relay:
    """A TCP relay to the server on ``target_port``; while ``frozen`` is set it holds back
    what the server sends (its clients see a server that took their query and went silent)."""

    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.frozen = threading.Event()
        self._sockets: list[socket.socket] = []

    def __enter__(self) -> _Relay:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._listener.close()
        for sock in self._sockets:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self._target_port))
            self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_server: bool) -> None:
        try:
            while data := source.recv(65536):
                while from_server and self.frozen.is_set():
                    time.sleep(0.01)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            source.close()
            sink.close()


def test_a_call_waiting_for_a_connection_held_too_long_fails_alone(postgres_url: str) -> None:
    db = open_database(postgres_url, FAST, pool_size=1)  # one connection: the call waits for it
    holding = threading.Event()
    held: list[str] = []

    def _hold() -> None:
        try:
            with db.transaction(write=False):
                holding.set()
                time.sleep(FAST.client_wait_s + 1.0)  # a caller stuck inside its transaction
        except RegistryUnavailableError as exc:
            held.append(exc.reason)

    holder = threading.Thread(target=_hold)
    holder.start()
    try:
        assert holding.wait(HANG_BOUND_S)
        error, elapsed = _timed_failure(lambda: _backend_pid(db))
        assert error.reason == f"its connection stayed busy for {FAST.client_wait_s:g} s"
        assert elapsed < HANG_BOUND_S
    finally:
        holder.join()
    # the stuck transaction itself was given up (idle past the limit: it held the connection)
    assert held == [f"no answer within {FAST.client_wait_s:g} s"]
    _backend_pid(db)  # free again, on a new connection
    db.close()


def test_transactions_do_not_nest(postgres_url: str) -> None:
    db = open_database(postgres_url, FAST)
    try:
        nesting = pytest.raises(RuntimeError, match="do not nest")
        with nesting, db.transaction(write=False), db.transaction(write=False):
            pass
        _backend_pid(db)  # the outer one rolled back; the connection serves on
    finally:
        db.close()
