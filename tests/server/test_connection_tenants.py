"""One tenant's connections must not shut every other tenant out of new connections.

A connection authenticated by a tenant key was never closed for a newcomer, so a tenant that
kept ``max_connections`` connections open (each kept alive by a cheap request every few seconds,
from two addresses at the defaults) had every other tenant's new connection closed at accept.
At ``max_connections`` the newcomer now takes the place of the oldest idle connection of the
tenant holding the most, else its connection whose request body has been due longest (past a
grace); other busy connections and the admin's are never closed for it."""

from __future__ import annotations

import http.client
import json
import socket
import time

from conftest import Served
from test_connections import FakeMember, _gate, _gate_of, serving

from loraplex.server.connections import RECEIVING_GRACE_S
from loraplex.server.listeners import ConnectionLimits

WAIT_S = 5.0


def _new_connection_status(host: str, port: int, headers: dict[str, str]) -> int:
    """The status of ``GET /v1/models`` on a new connection; 0: closed at accept."""
    fresh = http.client.HTTPConnection(host, port, timeout=WAIT_S)
    try:
        fresh.request("GET", "/v1/models", headers=headers)
        response = fresh.getresponse()
        response.read()
        return response.status
    except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected):
        return 0
    finally:
        fresh.close()


def test_at_max_connections_the_largest_tenants_oldest_idle_one_makes_room() -> None:
    gate, _ = _gate(max_connections=4, max_unauthenticated_connections=4)
    hog = [FakeMember(), FakeMember(), FakeMember(idle=False)]
    victim = FakeMember()
    for member in hog:
        assert gate.admit(member, "a")
        gate.authenticated(member, "acme")
    assert gate.admit(victim, "b")
    gate.authenticated(victim, "globex")
    newcomer = FakeMember()
    assert gate.admit(newcomer, "c")
    assert hog[0].evicted and not (hog[1].evicted or hog[2].evicted or victim.evicted)
    assert (gate.num_open, gate.num_evicted) == (4, 1)
    gate.authenticated(newcomer, "initech")
    assert gate.admit(FakeMember(), "c")  # acme still holds the most: its next idle one goes
    assert hog[1].evicted and not victim.evicted


def test_busy_and_admin_connections_are_never_closed_for_a_newcomer() -> None:
    gate, _ = _gate(max_connections=3, max_unauthenticated_connections=3)
    busy = [FakeMember(idle=False), FakeMember(idle=False)]
    admin = FakeMember()
    for member in busy:
        assert gate.admit(member, "a")
        gate.authenticated(member, "acme")
    assert gate.admit(admin, "a")
    gate.authenticated(admin)  # the admin key: no tenant
    assert not gate.admit(FakeMember(), "b")
    assert not (admin.evicted or any(m.evicted for m in busy)) and gate.num_refused == 1
    gate.release(busy[0])  # closed: its tenant's count goes with it
    assert gate.admit(FakeMember(), "b")


def test_a_tenant_holding_every_connection_leaves_room_for_another_tenant(
    served: Served,
) -> None:
    # every connection from one address here: its cap above the total, as with two addresses
    limits = ConnectionLimits(max_connections=8, max_unauthenticated_connections=4,
                              max_connections_per_address=16)  # fmt: skip
    acme = {"Authorization": f"Bearer {served.keys['acme']}"}
    globex = {"Authorization": f"Bearer {served.keys['globex']}"}
    with serving(served, limits) as (host, port, server):
        held = [http.client.HTTPConnection(host, port, timeout=WAIT_S) for _ in range(8)]
        for conn in held:  # every connection the server takes, authenticated and kept alive
            conn.request("GET", "/v1/models", headers=acme)
            response = conn.getresponse()
            response.read()
            assert response.status == 200
        assert _gate_of(server).num_open == 8
        status = _new_connection_status(host, port, globex)
        gate = _gate_of(server)
        evicted = gate.num_evicted
        for conn in held:
            conn.close()
    assert status == 200
    assert evicted == 1


def test_at_max_connections_the_largest_tenants_slowest_body_makes_room() -> None:
    # attack round 18: connections each holding a request whose body never ends are not idle,
    # so draining them freed nothing until body_read_timeout_s answered them (30 s)
    gate, _ = _gate(max_connections=4, max_unauthenticated_connections=4)
    young = FakeMember(idle=False, receiving=RECEIVING_GRACE_S / 2)
    slow = FakeMember(idle=False, receiving=RECEIVING_GRACE_S * 5)
    slower = FakeMember(idle=False, receiving=RECEIVING_GRACE_S * 9)
    for member in (young, slow, slower):
        assert gate.admit(member, "a")
        gate.authenticated(member, "acme")
    victim = FakeMember(idle=False, receiving=RECEIVING_GRACE_S * 20)
    assert gate.admit(victim, "b")
    gate.authenticated(victim, "globex")
    assert gate.admit(FakeMember(), "c")
    assert slower.body_cut and not (young.body_cut or slow.body_cut or victim.body_cut)
    assert (gate.num_open, gate.num_evicted) == (4, 1) and not any(
        m.drained for m in (young, slow, victim)
    )
    gate, _ = _gate(max_connections=2, max_unauthenticated_connections=2)
    young = FakeMember(idle=False, receiving=RECEIVING_GRACE_S / 2)  # its body may be on the way
    assert gate.admit(young, "a")
    gate.authenticated(young, "acme")
    busy = FakeMember(idle=False)
    assert gate.admit(busy, "b")
    gate.authenticated(busy, "globex")
    assert not gate.admit(FakeMember(), "c")  # none quiet, none slow: drained, as before
    assert young.drained and not young.body_cut


def _post_head(key: str, body: bytes) -> bytes:
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()


def test_a_tenant_holding_every_connection_with_a_body_due_leaves_room(served: Served) -> None:
    limits = ConnectionLimits(max_connections=8, max_unauthenticated_connections=4,
                              max_connections_per_address=16)  # fmt: skip
    body = json.dumps({"model": "support", "prompt": "hi", "max_tokens": 1}).encode()
    globex = {"Authorization": f"Bearer {served.keys['globex']}"}
    with serving(served, limits) as (host, port, server):
        gate, held = _gate_of(server), []
        for count in range(1, 9):  # every connection the server takes: a head, part of a body
            held.append(socket.create_connection((host, port), timeout=WAIT_S))
            held[-1].sendall(_post_head(served.keys["acme"], body) + body[:5])
            deadline = time.monotonic() + WAIT_S
            while (gate.num_open, gate.num_unauthenticated) != (count, 0):
                assert time.monotonic() < deadline, (gate.num_open, gate.num_unauthenticated)
                time.sleep(0.02)
        time.sleep(RECEIVING_GRACE_S + 0.2)
        status = _new_connection_status(host, port, globex)  # main: 0 until the bodies' 408s
        evicted = gate.num_evicted
        for sock in held:
            sock.close()
    assert status == 200
    assert evicted == 1
