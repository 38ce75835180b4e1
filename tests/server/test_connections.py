"""Connection floods: the listener's gate (``server/connections.py``) on its own, then on real
sockets against a running server.

Issue 25: ~1,100 unauthenticated half-open sockets, reopened as the server closed them, failed
95 % of every tenant's requests (uvicorn's one cap answered every request 503). Here a flood far
past the unauthenticated budget leaves an authenticated client's requests served, on its open
connection and on new ones.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import pytest
import uvicorn
from conftest import ADMIN_KEY, Served, make_app_deps
from fakes import FakeEngine
from live import listening
from prometheus_client import CollectorRegistry, generate_latest

from loraplex.clock import ManualClock
from loraplex.server.app import create_app
from loraplex.server.connections import ConnectionGate, GateLimits, address_key
from loraplex.server.listeners import ConnectionLimits, ListenerConfig
from loraplex.server.tarpit import Tarpit

WAIT_S = 5.0


class FakeMember:
    def __init__(
        self,
        idle: bool = True,
        quiet: float | None = 1.0,
        unread: bool = False,
        receiving: float | None = None,
        may_wait: bool = False,
    ) -> None:
        self.idle = idle
        # seconds since its last traffic when idle with nothing of a next request received
        self.quiet = quiet if idle else None
        self.unread = unread  # a request waits unread in its socket: not closed
        self.receiving = None if idle else receiving  # seconds its request's body has been due
        self.evicted = False
        self.drained = False
        self.body_cut = False
        self.may_wait = may_wait  # False: refused where it could wait for room
        self.waiting = False  # held for room a drained connection frees
        self.left = False  # its client closed it while it waited (``gone``)

    def is_idle(self) -> bool:
        return self.idle

    def quiet_s(self) -> float | None:
        return self.quiet

    def evict(self) -> bool:
        if self.unread:
            return False
        self.evicted = True
        return True

    def drain(self) -> None:
        self.drained = True

    def receiving_s(self) -> float | None:
        return self.receiving

    def cut_body(self) -> None:
        self.body_cut = True

    def hold(self) -> bool:
        self.waiting = self.may_wait
        return self.may_wait

    def let_in(self) -> None:
        self.waiting = False

    def gone(self) -> bool:
        return self.left


def _gate(**limits: int) -> tuple[ConnectionGate, ManualClock]:
    clock = ManualClock()
    values = {
        "max_connections": 100,
        "max_unauthenticated_connections": 100,
        "max_connections_per_address": 100,
        "accepts_per_s_per_address": 100,
        **limits,
    }
    return ConnectionGate(GateLimits(**values), clock), clock


def test_at_the_unauthenticated_budget_the_oldest_idle_one_makes_room() -> None:
    gate, _ = _gate(max_unauthenticated_connections=3)
    busy, idle_old, idle_new, authenticated = (FakeMember(idle=False), FakeMember(),
                                               FakeMember(), FakeMember())  # fmt: skip
    assert gate.admit(authenticated, "a")
    gate.authenticated(authenticated)  # out of the budget
    for member in (busy, idle_old, idle_new):
        assert gate.admit(member, "a")
    newcomer = FakeMember()
    assert gate.admit(newcomer, "b")
    assert idle_old.evicted and not (busy.evicted or idle_new.evicted or authenticated.evicted)
    assert (gate.num_open, gate.num_unauthenticated, gate.num_evicted) == (4, 3, 1)
    gate.release(idle_old)  # its close arrives later: nothing counts twice
    assert gate.num_open == 4


def test_with_nobody_idle_to_replace_a_newcomer_is_refused() -> None:
    gate, _ = _gate(max_connections=2, max_unauthenticated_connections=2)
    first, second = FakeMember(idle=False), FakeMember()
    assert gate.admit(first, "a") and gate.admit(second, "a")
    gate.authenticated(second)
    assert not gate.admit(FakeMember(), "a")  # the total is full of busy and authenticated ones
    assert not (first.evicted or second.evicted)
    gate.release(second)
    assert gate.admit(FakeMember(), "a")
    assert gate.num_refused == 1


def test_the_address_cap_replaces_only_that_address_connections() -> None:
    gate, _ = _gate(max_connections_per_address=2)
    other = FakeMember()
    mine = [FakeMember(), FakeMember()]
    assert gate.admit(other, "b")
    for member in mine:
        assert gate.admit(member, "a")
    newcomer = FakeMember()
    assert gate.admit(newcomer, "a")
    assert mine[0].evicted and not other.evicted
    gate.authenticated(mine[1])
    gate.authenticated(newcomer)
    assert not gate.admit(FakeMember(), "a")  # "b"'s idle one is not "a"'s to replace
    assert not other.evicted and gate.num_open == 3


def test_accepts_per_second_are_a_token_bucket_per_address() -> None:
    gate, clock = _gate(accepts_per_s_per_address=3)
    admitted = [gate.admit(FakeMember(), "a") for _ in range(5)]
    assert admitted == [True, True, True, False, False]
    assert gate.admit(FakeMember(), "b")  # another address has its own bucket
    clock.advance(0.34)  # one token back
    assert gate.admit(FakeMember(), "a") and not gate.admit(FakeMember(), "a")


def test_an_ipv6_client_counts_as_its_network() -> None:
    """A client holding a /64 passed both per-address bounds with a fresh address per
    connection: IPv6 addresses count as their /64 (``ipv6_address_prefix``)."""
    gate, clock = _gate(accepts_per_s_per_address=2)
    assert gate.admit(FakeMember(), "2001:db8:1:2::1")
    assert gate.admit(FakeMember(), "2001:db8:1:2:ffff::9")
    assert not gate.admit(FakeMember(), "2001:db8:1:2:abcd:1:2:3")  # the same /64: no token
    assert gate.admit(FakeMember(), "2001:db8:1:3::1")  # the next /64 has its own bucket
    clock.advance(1.0)
    gate, _ = _gate(max_connections_per_address=2)
    members = [FakeMember(idle=False) for _ in range(3)]
    assert gate.admit(members[0], "2001:db8::1") and gate.admit(members[1], "2001:db8::2")
    assert not gate.admit(members[2], "2001:db8::3")  # nobody idle of that /64 to replace


def test_address_keys() -> None:
    assert address_key("10.0.0.7", 64) == "10.0.0.7"
    assert address_key("::ffff:10.0.0.7", 64) == "10.0.0.7"  # a dual-stack listener's IPv4 peer
    assert address_key("2001:db8:1:2:3:4:5:6", 64) == "2001:db8:1:2::/64"
    assert address_key("2001:db8:1:2:3:4:5:6", 48) == "2001:db8:1::/48"
    assert address_key("2001:db8::6", 128) == "2001:db8::6/128"
    assert address_key("fe80::1%eth0", 64) == "fe80::/64"
    assert address_key("", 64) == "" and address_key("not:an:ip", 64) == "not:an:ip"


def test_an_ipv6_prefix_length_past_128_is_refused() -> None:
    for bad in (0, 129, True):
        with pytest.raises(ValueError, match="ipv6_address_prefix"):
            GateLimits(ipv6_address_prefix=bad)
    with pytest.raises(ValueError, match="ipv6_address_prefix 129 is invalid"):
        ConnectionLimits(ipv6_address_prefix=129)


def test_gate_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="accepts_per_s_per_address 0 is invalid"):
        GateLimits(accepts_per_s_per_address=0)
    with pytest.raises(ValueError, match="max_unauthenticated_connections 9 is invalid"):
        GateLimits(max_connections=8, max_unauthenticated_connections=9)
    with pytest.raises(ValueError, match="write_timeout_s 0 is invalid"):
        ConnectionLimits(write_timeout_s=0)
    assert ConnectionLimits(max_connections=10).gate().max_unauthenticated_connections == 5


def test_the_gate_counts_are_in_metrics() -> None:
    registry = CollectorRegistry()
    config = ListenerConfig(object(), ConnectionLimits(max_connections=2), metrics=registry)
    first, second = FakeMember(), FakeMember()
    assert config.gate.admit(first, "a")
    config.gate.authenticated(first)
    assert config.gate.admit(second, "a")
    assert config.gate.admit(FakeMember(idle=False), "a")  # second is idle: it makes room
    assert second.evicted
    assert not config.gate.admit(FakeMember(), "a")  # the newcomer is busy, first authenticated
    text = generate_latest(registry).decode()
    assert 'loraplex_connections{state="authenticated"} 1.0' in text
    assert 'loraplex_connections{state="unauthenticated"} 1.0' in text
    assert "loraplex_connections_refused_total 1.0" in text
    assert "loraplex_connections_evicted_total 1.0" in text


# --- real sockets ----------------------------------------------------------------------------


@contextmanager
def serving(served: Served, limits: ConnectionLimits) -> Iterator[tuple[str, int, uvicorn.Server]]:
    deps = make_app_deps(served, FakeEngine())
    with listening(create_app(deps), limits) as (url, server):
        address = urlsplit(url)
        yield address.hostname or "", address.port or 0, server
    assert deps.cache is not None
    deps.cache.close()


def _tarpit_of(server: uvicorn.Server) -> Tarpit:
    config = server.config
    assert isinstance(config, ListenerConfig)
    return config.tarpit


def test_a_connection_past_the_rate_is_held_then_reset_and_its_client_waits(
    served: Served,
) -> None:
    limits = ConnectionLimits(accepts_per_s_per_address=1)
    with serving(served, limits) as (host, port, server):
        tarpit = _tarpit_of(server)
        tarpit.hold_s = 1.0
        # NOTE: the gate's rate on a clock that stands still: on the real one, a loaded machine
        # that took a second between the two accepts refilled the token, and the second
        # connection was let in (then closed, not reset)
        assert isinstance(server.config, ListenerConfig)
        server.config.gate._clock = ManualClock()
        first = socket.create_connection((host, port), timeout=WAIT_S)  # the one token
        held = socket.create_connection((host, port), timeout=WAIT_S)
        began = time.monotonic()
        held.settimeout(0.3)
        with pytest.raises(TimeoutError):
            held.recv(1)  # neither answered nor closed at once: its client has to wait
        held.settimeout(WAIT_S)
        with pytest.raises(ConnectionResetError):
            held.recv(1)  # then reset (no FIN, no TIME_WAIT)
        assert time.monotonic() - began >= 0.9
        assert tarpit.num_held >= 1 and len(tarpit) == 0
        held.close()
        first.close()


def _gate_of(server: uvicorn.Server) -> ConnectionGate:
    config = server.config
    assert isinstance(config, ListenerConfig)
    return config.gate


class Flood:
    """``count`` sockets from this address that connect and send half a request head, reopened
    (at most one every ``pause_s``) whenever the server closes one."""

    def __init__(self, address: tuple[str, int], count: int, pause_s: float = 0.01) -> None:
        self.address = address
        self.count = count
        self.pause_s = pause_s
        self.num_opened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Flood:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _open(self) -> socket.socket | None:
        try:
            sock = socket.create_connection(self.address, timeout=1)
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # never finished
        except OSError:
            return None
        self.num_opened += 1
        sock.setblocking(False)
        return sock

    def _run(self) -> None:
        sockets: list[socket.socket] = []
        while not self._stop.is_set():
            alive = []
            for sock in sockets:
                try:
                    closed = sock.recv(1) == b""
                except BlockingIOError:
                    closed = False
                except OSError:
                    closed = True
                if closed:
                    sock.close()
                else:
                    alive.append(sock)
            sockets = alive
            while len(sockets) < self.count and not self._stop.is_set():
                sock = self._open()
                if sock is not None:
                    sockets.append(sock)
                time.sleep(self.pause_s)
            time.sleep(self.pause_s)
        for sock in sockets:
            sock.close()


def _models(conn: http.client.HTTPConnection, served: Served) -> int:
    conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {served.keys['acme']}"})
    response = conn.getresponse()
    response.read()
    return response.status


def test_a_half_open_flood_past_the_unauthenticated_budget_leaves_tenants_served(
    served: Served,
) -> None:
    limits = ConnectionLimits(max_connections=48, max_unauthenticated_connections=16,
                              accepts_per_s_per_address=10_000)  # fmt: skip
    with serving(served, limits) as (host, port, server):
        kept = http.client.HTTPConnection(host, port, timeout=WAIT_S)
        assert _models(kept, served) == 200  # authenticated: out of the flood's reach
        with Flood((host, port), count=64) as flood:
            deadline = time.monotonic() + WAIT_S
            while flood.num_opened < 64 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert flood.num_opened >= 64
            gate = _gate_of(server)
            assert gate.num_unauthenticated <= 16 and gate.num_evicted > 0
            statuses = []
            for _ in range(10):
                statuses.append(_models(kept, served))  # the kept-alive connection
                fresh = http.client.HTTPConnection(host, port, timeout=WAIT_S)
                statuses.append(_models(fresh, served))  # and a new one, during the flood
                fresh.close()
                time.sleep(0.02)
        kept.close()
    assert statuses == [200] * 20


def _answers(address: tuple[str, int], sock: socket.socket | None) -> bool:
    """Whether ``sock`` is served: False when the server closed it at accept (None: reset
    while it was still connecting, ``_connect``)."""
    if sock is None:
        return False
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return sock.recv(12).startswith(b"HTTP/1.1 200")
    except (ConnectionResetError, BrokenPipeError, TimeoutError):
        return False  # reset, or held and never answered (``tarpit.py``)


def _connect(address: tuple[str, int]) -> socket.socket | None:
    """A connection to ``address``; None when the server reset it before ``connect`` returned.

    NOTE: with a timeout, ``create_connection`` connects non-blocking and reads ``SO_ERROR``
    after the handshake; the server may accept the connection and reset it (a refusal at the
    accept rate, ``gated_accept.refuse``) in between, and connect then raises
    ConnectionResetError (seen once in CI). That is the same refusal, seen earlier."""
    try:
        return socket.create_connection(address, timeout=WAIT_S)
    except ConnectionResetError:
        return None


def test_connections_from_one_address_past_its_cap_are_closed(served: Served) -> None:
    limits = ConnectionLimits(max_connections_per_address=3)
    with serving(served, limits) as (host, port, server):
        kept = [http.client.HTTPConnection(host, port, timeout=WAIT_S) for _ in range(3)]
        for conn in kept:
            assert _models(conn, served) == 200  # three authenticated: none can be replaced
        fourth = _connect((host, port))  # may be reset before connect returns (_connect)
        try:
            assert not _answers((host, port), fourth)
        finally:
            if fourth is not None:
                fourth.close()
        kept.pop().close()
        # NOTE: not a fixed sleep: on a loaded machine the server saw the close after 0.2 s
        # (the next connection was then the fourth again, and reset).
        deadline = time.monotonic() + WAIT_S
        while _gate_of(server).num_open > 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        with socket.create_connection((host, port), timeout=WAIT_S) as again:
            assert _answers((host, port), again)
        for conn in kept:
            assert _models(conn, served) == 200
            conn.close()


def test_accepts_past_the_rate_of_one_address_are_closed(served: Served) -> None:
    limits = ConnectionLimits(accepts_per_s_per_address=4)
    with serving(served, limits) as (host, port, server):
        _tarpit_of(server).hold_s = 0.5  # held, then reset: not answered either way
        sockets = [_connect((host, port)) for _ in range(12)]
        served_flags = [_answers((host, port), sock) for sock in sockets]
        for sock in sockets:
            if sock is not None:
                sock.close()
        # a burst of four, plus what refilled while the twelve connected (well under a second)
        assert 4 <= sum(served_flags) < 12
        assert _gate_of(server).num_refused == 12 - sum(served_flags)


@pytest.mark.parametrize(
    ("path", "token", "authenticated"),
    [("/health", None, False), ("/v1/models", "tenant", True), ("/admin/tenants", ADMIN_KEY, True),
     ("/v1/models", "lpx_bad_key", False)],
)  # fmt: skip
def test_a_request_past_a_credential_check_authenticates_its_connection(
    served: Served, path: str, token: str | None, authenticated: bool
) -> None:
    with serving(served, ConnectionLimits()) as (host, port, server):
        conn = http.client.HTTPConnection(host, port, timeout=WAIT_S)
        if token == "tenant":
            token = served.keys["acme"]
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        status = conn.getresponse().status
        gate = _gate_of(server)
        if authenticated:
            assert status == 200 and (gate.num_open, gate.num_unauthenticated) == (1, 0)
        elif status == 200:  # a public path: served, still unauthenticated
            assert (gate.num_open, gate.num_unauthenticated) == (1, 1)
        else:  # a failed check answers 401 and closes the connection
            assert status == 401
        conn.close()
