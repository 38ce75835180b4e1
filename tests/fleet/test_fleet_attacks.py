"""A hostile tenant's connections against a running fleet (a real local Ray cluster, one engine
replica and the ingress as ``loraplex fleet up`` deploys them): the connection gate's bounds
that ``test_fleet_e2e.py`` does not probe hold on the ingress's own listener as in ``serve``.

Covers ``max_unauthenticated_connections`` (an idle flood pushes out only its own kind),
connections authenticated through the ingress's app staying out of that flood's reach,
``max_connections`` (a newcomer takes the place of the quietest connection of the tenant holding
the most) and ``accepts_per_s_per_address`` with the tarpit (connections past the rate are held
silently). Each test connects from a loopback address of its own (127.0.0.x), so one test's
accept bucket or per-address count never meets another's. The rest of the probes this file's
author ran (request fields, other tenants' adapters, bodies, heads, cancellation storms) answered
as ``serve`` did: docs/operations.md, *A fleet's listener: which bounds hold*.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import pytest

ray = pytest.importorskip("ray")

from fleet_deploy import deployed  # noqa: E402

from loraplex.demo.assets import DemoAssets  # noqa: E402

pytestmark = pytest.mark.slow
# The gate's caps, small (serve's defaults: 1024, half of it, 512, 512). The head deadline and
# the keep-alive timeout leave idle sockets open while a test runs, even a slow one; the accept
# rate stays above the fixture's own polling.
GATE = {"max_connections": 12, "max_unauthenticated_connections": 4,
        "max_connections_per_address": 12, "accepts_per_s_per_address": 10,
        "header_read_timeout_s": 30.0, "keep_alive_timeout_s": 30}  # fmt: skip
MODELS = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n"
HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


@dataclass(frozen=True)
class Fleet:
    address: tuple[str, int]
    admin_key: str
    keys: dict[str, str]

    def metric(self, line_start: str) -> float:
        headers = {"Authorization": f"Bearer {self.admin_key}"}
        host, port = self.address
        text = httpx.get(f"http://{host}:{port}/metrics", headers=headers, timeout=30).text
        return next(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(line_start))


@pytest.fixture(scope="module")
def fleet(
    demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory, ray_cluster: None
) -> Iterator[Fleet]:
    with ExitStack() as stack:
        prepared, url = deployed(
            stack, demo_assets, tmp_path_factory, "fleet-attacks", 1,
            max_loras=2, max_num_seqs=2, **GATE,
        )  # fmt: skip
        parts = urlsplit(url)
        yield Fleet((parts.hostname or "", parts.port or 0), prepared.admin_key,
                    prepared.sample_keys)  # fmt: skip


def _connect(stack: ExitStack, fleet: Fleet, source: str) -> socket.socket:
    sock = socket.socket()
    stack.callback(sock.close)
    sock.settimeout(30)
    sock.bind((source, 0))
    sock.connect(fleet.address)
    return sock


def _state(sock: socket.socket) -> str:
    """'closed' (an EOF or a reset waits), 'answered' (bytes wait) or 'silent'; never blocks."""
    sock.setblocking(False)  # NOTE: a socket with a timeout polls for it before any recv
    try:
        return "closed" if sock.recv(65536, socket.MSG_PEEK) == b"" else "answered"
    except BlockingIOError:
        return "silent"
    except ConnectionResetError:
        return "closed"
    finally:
        sock.settimeout(30)


def _authenticate(sock: socket.socket, key: str) -> None:
    sock.sendall(MODELS % key.encode())
    assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
    time.sleep(0.05)  # the rest of the reply, if it came in two segments
    while _state(sock) == "answered":
        sock.recv(65536)


def _settle(socks: list[socket.socket], closed: int) -> list[str]:
    """Each socket's state once ``closed`` of them are closed (or after 5 s)."""
    deadline = time.monotonic() + 5.0
    while True:
        states = [_state(s) for s in socks]
        if states.count("closed") >= closed or time.monotonic() > deadline:
            return states
        time.sleep(0.05)


def test_an_idle_flood_keeps_only_max_unauthenticated_connections(fleet: Fleet) -> None:
    """Past ``max_unauthenticated_connections`` an idle newcomer takes the oldest idle one's
    place; connections authenticated through the ingress's app stay out of its reach."""
    cap = GATE["max_unauthenticated_connections"]
    with ExitStack() as stack:
        tenant = [_connect(stack, fleet, "127.0.0.21") for _ in range(3)]
        for sock in tenant:
            _authenticate(sock, fleet.keys["acme"])
        flood = [_connect(stack, fleet, "127.0.0.22") for _ in range(cap + 3)]
        states = _settle(flood, closed=3)
        assert states == ["closed"] * 3 + ["silent"] * cap, states
        assert [_state(s) for s in tenant] == ["silent"] * 3  # open, nothing more said
        for sock in tenant:  # and still serving
            _authenticate(sock, fleet.keys["acme"])


def test_at_max_connections_a_newcomer_takes_the_biggest_tenants_quietest_place(
    fleet: Fleet,
) -> None:
    """At ``max_connections``, all of them authenticated, another tenant's new connection is
    served: the tenant holding them all loses its quietest one."""
    total = GATE["max_connections"]
    evicted = fleet.metric("loraplex_connections_evicted_total")  # before the room is full
    with ExitStack() as stack:
        hog = []
        for i in range(total):  # each authenticated at once (the unauthenticated cap is 4)
            hog.append(_connect(stack, fleet, f"127.0.0.{23 + i % 2}"))
            _authenticate(hog[-1], fleet.keys["acme"])  # one after another: the first is quietest
        victim = _connect(stack, fleet, "127.0.0.25")
        _authenticate(victim, fleet.keys["globex"])
        states = _settle(hog, closed=1)
        assert states == ["closed"] + ["silent"] * (total - 1), states
        assert fleet.metric("loraplex_connections_evicted_total") >= evicted + 1


def test_connections_past_the_accept_rate_are_held_silently(fleet: Fleet) -> None:
    """Past ``accepts_per_s_per_address`` (a bucket of one second's worth) a new connection is
    accepted and held by the tarpit: nothing read, nothing answered, not closed."""
    rate = GATE["accepts_per_s_per_address"]
    with ExitStack() as stack:
        socks = [_connect(stack, fleet, "127.0.0.26") for _ in range(3 * rate)]
        for sock in socks:
            with contextlib.suppress(OSError):  # one the gate closed already
                sock.sendall(HEALTH)
        time.sleep(1.0)
        held = fleet.metric('loraplex_connections{state="held"}')
        states = [_state(s) for s in socks]
    # the first bucketful was gated (answered, or closed by the unauthenticated cap after its
    # answer); the bucket refills while the listener accepts the rest (no upper bound here: a
    # loaded machine accepts slowly), but three seconds' worth at once cannot all pass
    silent = states.count("silent")
    assert len(socks) - silent >= rate, states
    assert silent >= 1, states
    assert held >= silent, (held, states)
