"""A SQLite registry's connections: a slow read (an administrator's large listing) holds up no
tenant lookup, other read or write of the same process; administrators' reads never hold every
read connection; a read transaction writes nothing; the file must be in WAL mode.

The slow read is held inside its statement by a progress handler (SQLite calls it while the
statement runs, on the reading thread) until the test releases it: completion and ordering are
asserted, never durations; waits are bounded far above anything a test does, so that a call
that waits behind the held read fails instead of blocking the run.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from registry_kit import AdapterFactory, StepClock
from test_postgres_pool import _in_thread

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.errors import RegistryUnavailableError
from loraplex.registry import RegistrationRequest, Registry, RegistryConfig, open_registry
from loraplex.registry.sql.connect import open_database
from loraplex.registry.sql.sqlite import READ_CONNECTIONS, SqliteDatabase

HANG_BOUND_S = 20.0


class _Hold:
    """Holds every statement run on a thread marked ``slow`` inside its execution (SQLite's
    progress handler, installed on every connection opened while the test runs) until
    ``release``; ``inside`` counts the threads held."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.release = threading.Event()
        self._cond = threading.Condition()
        self._inside = 0
        self._threads: list[threading.Thread] = []

    def handler(self, in_transaction: bool) -> int:
        if (
            in_transaction
            and getattr(self.local, "slow", False)
            and not getattr(self.local, "held", False)
        ):
            self.local.held = True  # once per thread: then it runs to its end
            with self._cond:
                self._inside += 1
                self._cond.notify_all()
            self.release.wait(HANG_BOUND_S)
        return 0  # go on

    def wait_inside(self, count: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self._inside >= count, HANG_BOUND_S)

    @property
    def inside(self) -> int:
        with self._cond:
            return self._inside

    def start(self, call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
        """``call`` on a thread of its own, marked slow."""

        def _marked() -> object:
            self.local.slow = True
            return call()

        started = _in_thread(_marked)
        self._threads.append(started[0])
        return started

    def end(self) -> None:
        """Releases the held statements and waits for their threads (before the database
        closes: closing a connection inside a statement crashes the process)."""
        self.release.set()
        for thread in self._threads:
            thread.join(HANG_BOUND_S)


@pytest.fixture
def hold(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Hold]:
    held = _Hold()
    connect = sqlite3.connect

    def _connect(*args: object, **kwargs: object) -> sqlite3.Connection:
        conn = connect(*args, **kwargs)  # type: ignore[call-overload]
        # NOTE: held inside the statement after BEGIN (a deferred BEGIN reads nothing yet)
        conn.set_progress_handler(lambda: held.handler(conn.in_transaction), 1)
        return conn  # type: ignore[no-any-return]

    monkeypatch.setattr(sqlite3, "connect", _connect)  # the module sqlite.py connects through
    yield held
    held.end()


def _done(call: Callable[[], object]) -> object:
    """``call``'s result, run on another thread and waited for at most ``HANG_BOUND_S`` (on
    main it waited behind the held read: the test fails instead of hanging)."""
    thread, outcome = _in_thread(call)
    thread.join(HANG_BOUND_S)
    assert not thread.is_alive(), "it waited behind the slow read"
    (result,) = outcome
    if isinstance(result, Exception):
        raise result
    return result


@pytest.fixture
def sqlite_registry(
    tmp_path: Path, base: BaseModelSpec, make_adapter: AdapterFactory
) -> Iterator[Registry]:
    config = RegistryConfig(tmp_path / "data", f"sqlite:///{tmp_path / 'registry.sqlite3'}")
    registry = open_registry(config, base, wall_clock=StepClock())
    registry.create_tenant("acme", actor="test")
    registry.register(RegistrationRequest(make_adapter("a"), "acme", "bot", "v1"), "test")
    yield registry
    registry.close()


def test_a_slow_admin_read_holds_up_no_serving_lookup(
    hold: _Hold, sqlite_registry: Registry
) -> None:
    """On main the listing held the registry's one connection inside its statement, and the
    tenant's authentication and resolution waited for it (here: the hang bound)."""
    registry = sqlite_registry
    key = registry.create_key("acme", actor="test")
    listing, listed = hold.start(registry.list_adapters)
    try:
        hold.wait_inside(1)  # the listing is inside its statement, its snapshot open
        # while it is held: a tenant's authentication and resolution, the readiness probe,
        # another admin read and an admin write, all on the same registry (one process)
        assert _done(lambda: registry.authenticate(key.token).name) == "acme"
        assert _done(lambda: registry.resolve("acme", "bot").revision) == "v1"
        _done(registry.ping)
        assert _done(lambda: [k.key_id for k in registry.list_keys("acme")]) == [key.key_id]
        assert _done(lambda: registry.create_tenant("beta", actor="test").name) == "beta"
        assert listed == []  # still inside its statement: nothing failed it to make room
        assert listing.is_alive()
    finally:
        hold.end()
    (adapters,) = listed
    assert [a.name for a in adapters] == ["bot"]  # type: ignore[attr-defined]
    assert [t.name for t in registry.list_tenants()] == ["acme", "beta"]


def test_admin_reads_leave_a_read_connection_to_tenant_requests(
    hold: _Hold, sqlite_registry: Registry
) -> None:
    """As many slow admin listings as there are read connections: three are held inside their
    statements, the fourth waits in the process for one of them, and a tenant's resolution
    takes the read connection kept for tenant requests."""
    registry = sqlite_registry
    listings = [hold.start(registry.list_adapters) for _ in range(READ_CONNECTIONS)]
    try:
        hold.wait_inside(READ_CONNECTIONS - 1)
        assert _done(lambda: registry.resolve("acme", "bot").revision) == "v1"  # the reserve's
        assert [outcome for _, outcome in listings] == [[]] * READ_CONNECTIONS  # none failed
        assert hold.inside == READ_CONNECTIONS - 1  # the last one waits for a connection
    finally:
        hold.end()
    assert [len(outcome) for _, outcome in listings] == [1] * READ_CONNECTIONS
    assert all(isinstance(outcome[0], list) for _, outcome in listings)


def _held_read(
    db: SqliteDatabase, serving: bool = False
) -> tuple[threading.Event, Callable[[], None]]:
    """A read transaction of ``db`` held open on another thread until the returned call."""
    holding, release = threading.Event(), threading.Event()

    def _hold() -> None:
        with db.transaction(write=False, serving=serving) as tx:
            tx.query_one("SELECT 1")
            holding.set()
            release.wait(HANG_BOUND_S)

    holder, outcome = _in_thread(_hold)

    def _end() -> None:
        release.set()
        holder.join(HANG_BOUND_S)
        assert outcome == [None]

    assert holding.wait(HANG_BOUND_S)
    return holding, _end


def test_reads_other_than_tenant_requests_hold_all_but_one_read_connection(
    tmp_path: Path,
) -> None:
    db = SqliteDatabase(str(tmp_path / "registry.db"), read_connections=2, wait_s=0.2)
    _, end = _held_read(db)
    try:
        with pytest.raises(RegistryUnavailableError) as caught, db.transaction(write=False):
            pass
        assert caught.value.reason == (
            "the 1 of its 2 read connections that calls other than tenant requests may hold "
            "stayed busy for 0.2 s"
        )
        _, end_serving = _held_read(db, serving=True)  # a tenant request's still goes
        try:
            with (
                pytest.raises(RegistryUnavailableError) as caught,
                db.transaction(write=False, serving=True),
            ):
                pass
            assert caught.value.reason == "its 2 read connections stayed busy for 0.2 s"
        finally:
            end_serving()
    finally:
        end()
    with db.transaction(write=False) as tx:  # the share is free again
        assert tx.query_one("SELECT 3") == (3,)
    db.close()


def test_a_write_waits_for_its_turn_at_most_the_wait_limit(tmp_path: Path) -> None:
    db = SqliteDatabase(str(tmp_path / "registry.db"), wait_s=0.2)
    with db.transaction() as tx:
        tx.execute("CREATE TABLE t (v INTEGER)")
    writing, release = threading.Event(), threading.Event()

    def _write() -> None:
        with db.transaction() as tx:
            tx.execute("INSERT INTO t VALUES (1)")
            writing.set()
            release.wait(HANG_BOUND_S)

    writer, outcome = _in_thread(_write)
    try:
        assert writing.wait(HANG_BOUND_S)
        with pytest.raises(RegistryUnavailableError) as caught, db.transaction():
            pass
        assert caught.value.reason == "another write in this process went on for 0.2 s"
        with db.transaction(write=False) as tx:  # a read goes on, before the write commits
            assert tx.query("SELECT v FROM t") == []
    finally:
        release.set()
        writer.join(HANG_BOUND_S)
    assert outcome == [None]
    with db.transaction(write=False) as tx:
        assert tx.query("SELECT v FROM t") == [(1,)]
    db.close()


def test_a_read_transaction_writes_nothing(tmp_path: Path) -> None:
    """Reads run on read-only connections: a write in one is refused (on main it was
    committed, with no write lock taken first)."""
    db = SqliteDatabase(str(tmp_path / "registry.db"))
    with db.transaction() as tx:
        tx.execute("CREATE TABLE t (v INTEGER)")
    with (
        pytest.raises(sqlite3.OperationalError, match="readonly"),
        db.transaction(write=False) as tx,
    ):
        tx.execute("INSERT INTO t VALUES (1)")
    with db.transaction(write=False) as tx:
        assert tx.query("SELECT v FROM t") == []
    db.close()


def test_transactions_do_not_nest(tmp_path: Path) -> None:
    db = SqliteDatabase(str(tmp_path / "registry.db"))
    with (
        pytest.raises(RuntimeError, match=r"^registry transactions do not nest$"),
        db.transaction(),
        db.transaction(write=False),
    ):
        pass
    with db.transaction(write=False) as tx:  # both ended: the next one goes
        assert tx.query_one("SELECT 1") == (1,)
    db.close()


def test_a_closed_database_serves_nothing(tmp_path: Path) -> None:
    db = SqliteDatabase(str(tmp_path / "registry.db"))
    with db.transaction(write=False) as tx:  # a read connection opened, then idle
        tx.query_one("SELECT 1")
    db.close()
    for write in (True, False):
        with (
            pytest.raises(RegistryUnavailableError, match="it was closed"),
            db.transaction(write=write),
        ):
            pass


def test_a_database_not_in_wal_mode_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readers on connections of their own need WAL (else they block the writer): a file that
    stays in another journal mode is refused naming the url (here one whose connection is an
    in-memory database's, journal mode "memory")."""
    connect = sqlite3.connect

    def _in_memory(*args: object, **kwargs: object) -> sqlite3.Connection:
        return connect(":memory:")

    monkeypatch.setattr(sqlite3, "connect", _in_memory)
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    with pytest.raises(ValueError) as caught:
        open_database(url)
    assert str(caught.value) == (
        f"database url {url!r} is invalid: its journal mode stays 'memory', not WAL (a "
        "filesystem without shared memory?), and its readers would block its writer"
    )


def test_an_in_memory_database_is_refused_before_any_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On main ``sqlite:///:memory:`` created a file named ":memory:" in the working directory
    and served from a database that no other connection could read."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as caught:
        open_database("sqlite:///:memory:")
    assert str(caught.value) == (
        "database url 'sqlite:///:memory:' is invalid; expected sqlite:///PATH of a file "
        "(an in-memory database is one per connection: readers would not see the writer's rows)"
    )
    assert list(tmp_path.iterdir()) == []


# A statement that runs until interrupted (a count far past anything a test waits for).
_RUNAWAY = (
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000000000000) "
    "SELECT count(*) FROM n"
)


def test_a_runaway_read_is_interrupted_and_gives_its_connection_back(tmp_path: Path) -> None:
    """On main a read ran as long as its statement did, holding its read connection (here the
    only one) while every other read waited for it: the call on the other thread hangs."""
    db = SqliteDatabase(str(tmp_path / "registry.db"), read_connections=1, read_timeout_s=0.2)

    def _runaway() -> object:
        with db.transaction(write=False) as tx:
            return tx.query_one(_RUNAWAY)

    with pytest.raises(RegistryUnavailableError) as caught:
        _done(_runaway)
    assert caught.value.reason == "a read went on for 0.2 s"
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
    with db.transaction(write=False) as tx:  # the connection is back, and usable
        assert tx.query_one("SELECT 4") == (4,)
    db.close()


def test_a_read_within_its_time_is_not_interrupted_later(tmp_path: Path) -> None:
    """The deadline belongs to one transaction: a read that ended before it leaves the next
    read on the same connection alone."""
    db = SqliteDatabase(str(tmp_path / "registry.db"), read_connections=1, read_timeout_s=0.2)
    with db.transaction(write=False) as tx:
        assert tx.query_one("SELECT 1") == (1,)
    end = threading.Event()
    end.wait(0.4)  # past the first read's deadline
    with db.transaction(write=False) as tx:
        assert tx.query_one("SELECT count(*) FROM (SELECT 1 UNION ALL SELECT 2)") == (2,)
    db.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"read_connections": 0}, "read_connections 0 is invalid; expected 1 to 64"),
        ({"read_connections": 65}, "read_connections 65 is invalid; expected 1 to 64"),
        ({"wait_s": 0}, "wait_s 0 is invalid; expected > 0, <= 30"),
        ({"wait_s": 30.5}, "wait_s 30.5 is invalid; expected > 0, <= 30"),
        ({"read_timeout_s": 0}, "read_timeout_s 0 is invalid; expected > 0, <= 10"),
        ({"read_timeout_s": 11}, "read_timeout_s 11 is invalid; expected > 0, <= 10"),
        ({"write_timeout_s": 0}, "write_timeout_s 0 is invalid; expected > 0, <= 10"),
        ({"write_timeout_s": 10.5}, "write_timeout_s 10.5 is invalid; expected > 0, <= 10"),
    ],
)
def test_out_of_range_settings_are_refused_before_any_file(
    tmp_path: Path, kwargs: dict[str, float], message: str
) -> None:
    with pytest.raises(ValueError) as caught:
        SqliteDatabase(str(tmp_path / "registry.db"), **kwargs)  # type: ignore[arg-type]
    assert str(caught.value) == message
    assert list(tmp_path.iterdir()) == []


def test_settings_at_their_bounds_are_accepted(tmp_path: Path) -> None:
    db = SqliteDatabase(
        str(tmp_path / "registry.db"),
        read_connections=64,
        wait_s=30,
        read_timeout_s=10,
        write_timeout_s=10,
    )
    with db.transaction(write=False) as tx:
        assert tx.query_one("SELECT 1") == (1,)
    db.close()
