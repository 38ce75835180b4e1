"""One tenant's connections must not shut every other tenant out of new connections.

A connection authenticated by a tenant key was never closed for a newcomer, so a tenant that
kept ``max_connections`` connections open (each kept alive by a cheap request every few seconds,
from two addresses at the defaults) had every other tenant's new connection closed at accept.
At ``max_connections`` the newcomer now takes the place of the oldest idle connection of the
tenant holding the most; busy connections and the admin's are never closed for it."""

from __future__ import annotations

import http.client

from conftest import Served
from test_connections import FakeMember, _gate, _gate_of, serving

from loraplex.server.listeners import ConnectionLimits

WAIT_S = 5.0


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
        fresh = http.client.HTTPConnection(host, port, timeout=WAIT_S)
        try:
            fresh.request("GET", "/v1/models", headers=globex)
            response = fresh.getresponse()
            status = response.status
            response.read()
        except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected):
            status = 0  # closed at accept
        finally:
            fresh.close()
        gate = _gate_of(server)
        evicted = gate.num_evicted
        for conn in held:
            conn.close()
    assert status == 200
    assert evicted == 1
