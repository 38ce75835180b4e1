"""One tenant must not hold more than its share of the connections while others are turned away.

Attack round 18 (``body-hog --mode flight``): a tenant with a whole request in flight on every
one of ``max_connections`` connections is never cut (its work would be lost), only drained; a
drained connection's close freed room its reconnect took first, so another tenant's new
connections were reset (1 of 40 served). Now each newcomer turned away drains that tenant down to
``max_tenant_connection_share``, and while newcomers are turned away its new connections beyond
the share are answered 429 and closed."""

from __future__ import annotations

import json
import socket
import time

import pytest
from conftest import Served
from test_connection_tenants import WAIT_S, _new_connection_status, _post_head
from test_connections import FakeMember, _gate_of, serving

from loraplex.clock import ManualClock
from loraplex.server import connections
from loraplex.server.connections import CONTENDED_S, ConnectionGate, GateLimits
from loraplex.server.listeners import ConnectionLimits

ANSWER_S = 2.0  # an answer refused at once comes within this


def _gate(max_connections: int, share: float = 0.5) -> tuple[ConnectionGate, ManualClock]:
    clock = ManualClock()
    limits = GateLimits(max_connections=max_connections,
                        max_unauthenticated_connections=max_connections,
                        max_tenant_connection_share=share)  # fmt: skip
    return ConnectionGate(limits, clock), clock


def _busy(gate: ConnectionGate, tenant: str | None, count: int) -> list[FakeMember]:
    members = [FakeMember(idle=False) for _ in range(count)]
    for member in members:
        assert gate.admit(member, "a")
        assert gate.authenticated(member, tenant)
    return members


def test_a_tenant_alone_may_hold_every_connection() -> None:
    gate, _ = _gate(4)
    _busy(gate, "acme", 4)  # no newcomer turned away yet: no share applies
    assert gate.num_refused == 0


def test_a_newcomer_turned_away_drains_the_largest_tenant_down_to_its_share() -> None:
    gate, clock = _gate(4)
    hog = _busy(gate, "acme", 4)
    assert not gate.admit(FakeMember(), "b")  # busy all: the newcomer is turned away
    assert [m.drained for m in hog] == [True, True, False, False]  # main: only the oldest
    assert (gate.num_refused, gate.num_drained) == (1, 2)
    assert not gate.admit(FakeMember(), "b")  # its drained ones will free room: none more
    assert (gate.num_refused, gate.num_drained) == (2, 2)
    for member in hog[:2]:  # answered, then closed
        gate.release(member)
    reconnect = FakeMember(idle=False)
    assert gate.admit(reconnect, "a")  # room: admitted, but acme holds its share (2 of 4)
    assert not gate.authenticated(reconnect, "acme")
    assert gate.num_refused == 3
    # kept open after its 429: its next request is refused again, the connection counted once
    assert not gate.authenticated(reconnect, "acme")
    assert gate.num_refused == 3
    other = FakeMember(idle=False)
    assert gate.admit(other, "b") and gate.authenticated(other, "globex")
    assert gate.authenticated(FakeMember(), None)  # not admitted: nothing to count
    gate.release(reconnect)
    admin = FakeMember(idle=False)
    assert gate.admit(admin, "a") and gate.authenticated(admin)  # the admin key: never refused
    gate.release(admin)
    clock.advance(CONTENDED_S)  # nobody turned away for CONTENDED_S: no share applies
    later = FakeMember(idle=False)
    assert gate.admit(later, "a") and gate.authenticated(later, "acme")


def test_a_connection_refused_at_the_share_makes_room_for_a_newcomer() -> None:
    gate, _ = _gate(4)
    hog = _busy(gate, "acme", 3)
    busy = FakeMember(idle=False)
    assert gate.admit(busy, "b") and gate.authenticated(busy, "globex")
    assert not gate.admit(FakeMember(), "c")  # turned away: contended from here
    gate.release(hog[0])  # its drained answer ended; acme reconnects at once
    reconnect = FakeMember(idle=False)
    assert gate.admit(reconnect, "a") and not gate.authenticated(reconnect, "acme")
    newcomer = FakeMember()
    assert gate.admit(newcomer, "c")  # the refused reconnect, answering its 429, is cut
    assert reconnect.body_cut and not any(m.body_cut or m.evicted for m in [*hog, busy])
    assert (gate.num_open, gate.num_evicted) == (4, 1)


def _refused_reconnect(gate: ConnectionGate) -> FakeMember:
    """acme, at its share (2 of 4) under contention, had a connection from "a" refused, which its
    client then closed; its reconnect from "a" has its request unread (not cut by eviction)."""
    _busy(gate, "acme", 2)
    globex = _busy(gate, "globex", 2)
    assert not gate.admit(FakeMember(), "c")  # busy all: turned away, contended from here
    gate.release(globex[0])  # one of globex's answered: room
    refused = FakeMember(idle=False)
    assert gate.admit(refused, "a") and not gate.authenticated(refused, "acme")
    gate.release(refused)  # the hog closed it after its 429 (on main: the server did)
    reconnect = FakeMember(idle=False, unread=True)
    assert gate.admit(reconnect, "a")
    return reconnect


def test_a_refused_tenants_reconnect_not_yet_read_makes_room_for_a_newcomer() -> None:
    gate, _ = _gate(4)
    reconnect = _refused_reconnect(gate)
    assert gate.admit(FakeMember(), "c")  # main: turned away (the reconnect held the room)
    assert reconnect.body_cut and gate.num_evicted == 1 and gate.num_open == 4


def test_a_refused_address_loses_no_connection_to_its_own_newcomer_or_after_contention() -> None:
    gate, clock = _gate(4)
    reconnect = _refused_reconnect(gate)
    assert not gate.admit(FakeMember(), "a")  # from the same address: nothing to tell apart
    clock.advance(CONTENDED_S)  # its address's refusal forgotten, as contention is
    assert not gate.admit(FakeMember(), "c")
    assert not reconnect.body_cut and gate.num_evicted == 0


def test_the_refused_addresses_kept_are_only_the_last_contended_seconds() -> None:
    """Each refusal forgets addresses refused longer than CONTENDED_S ago, so a tenant refused
    from ever new addresses (IPv6) grows the map only by what the last CONTENDED_S refused."""
    gate, clock = _gate(4)
    _refused_reconnect(gate)  # refused from "a" at 0
    clock.advance(CONTENDED_S - 1)
    assert gate.admit(FakeMember(idle=False), "c")  # the reconnect from "a" is cut for it
    assert not gate.admit(FakeMember(idle=False), "e")  # turned away: contended again
    clock.advance(2)  # "a"'s refusal is CONTENDED_S + 1 old, the contention 2 s
    gate.release(next(iter(gate._by_tenant["globex"])))
    refused = FakeMember(idle=False)
    assert gate.admit(refused, "d") and not gate.authenticated(refused, "acme")
    assert set(gate._refused_at) == {"d"}


def test_a_connection_kept_open_after_its_refusal_is_let_in_below_the_share() -> None:
    gate, _ = _gate(4)
    hog = _busy(gate, "acme", 4)
    assert not gate.admit(FakeMember(), "b")  # contended: acme's two oldest drained
    for member in hog[:3]:  # three answered and closed: acme holds one, below its share
        gate.release(member)
    kept = FakeMember(idle=False)
    assert gate.admit(kept, "a") and gate.authenticated(kept, "acme")  # 2 of 4: in
    refused = FakeMember(idle=False)
    assert gate.admit(refused, "a") and not gate.authenticated(refused, "acme")
    assert not gate.authenticated(refused, "acme")  # its next request: still at the share
    gate.release(kept)
    assert gate.authenticated(refused, "acme")  # below the share again: served, counted
    third = FakeMember(idle=False)
    assert gate.admit(third, "a") and not gate.authenticated(third, "acme")  # 2 held again


def test_a_newcomer_with_nothing_to_close_waits_for_a_drained_connections_room() -> None:
    gate, _ = _gate(4)
    hog = _busy(gate, "acme", 4)
    first, second, third = (FakeMember(may_wait=True) for _ in range(3))
    assert gate.admit(first, "b") and first.waiting  # main: turned away (reset at accept)
    assert [m.drained for m in hog] == [True, True, False, False]
    assert gate.admit(second, "c") and second.waiting  # one waits for each drained one
    assert not gate.admit(third, "d") and not third.waiting
    assert (gate.num_open, gate.num_waiting, gate.num_refused) == (4, 2, 1)
    gate.release(second)  # its head deadline passed: closed while it waited
    gate.release(hog[0])  # a drained answer ended: the oldest waiting newcomer takes its room
    assert not first.waiting and (gate.num_open, gate.num_waiting) == (4, 0)
    assert gate.authenticated(first, "globex")
    late = FakeMember(may_wait=True)
    assert gate.admit(late, "d") and late.waiting  # hog[1] still drained
    assert not gate.admit(FakeMember(may_wait=True), "d")  # none more than drained ones
    gate.release(hog[1])
    assert not late.waiting and gate.num_open == 4


@pytest.mark.parametrize("share", [0, 0.0, 1.5, -0.5, True, "0.5"])
def test_an_invalid_share_is_refused_naming_the_setting(share: object) -> None:
    with pytest.raises(ValueError, match="max_tenant_connection_share"):
        GateLimits(max_tenant_connection_share=share)  # type: ignore[arg-type]


def test_the_share_counts_at_least_one_connection() -> None:
    assert GateLimits(max_connections=3, max_unauthenticated_connections=1,
                      max_tenant_connection_share=0.1).tenant_share == 1  # fmt: skip
    assert GateLimits(max_tenant_connection_share=1).tenant_share == 1024


def _status(sock: socket.socket) -> tuple[int, dict[str, object]]:
    """The status and JSON body of the answer on ``sock`` (framed by its Content-Length); 0 and
    {}: none within ``ANSWER_S``."""
    data = b""
    sock.settimeout(ANSWER_S)
    while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _length(data):
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return 0, {}
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def _get_models(key: str) -> bytes:
    return f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n".encode()


def _length(data: bytes) -> int:
    for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def test_a_tenant_with_work_in_flight_on_every_connection_leaves_room(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    # acme's connections each with a request that may not be cut: a body still due, within a
    # grace raised here past the test (a request queued or generating is never cut either)
    monkeypatch.setattr(connections, "RECEIVING_GRACE_S", 60.0)
    limits = ConnectionLimits(max_connections=4, max_unauthenticated_connections=2,
                              max_connections_per_address=16)  # share 0.5: 2  # fmt: skip
    body = json.dumps({"model": "support", "prompt": "hi", "max_tokens": 1}).encode()
    acme, globex = served.keys["acme"], {"Authorization": f"Bearer {served.keys['globex']}"}
    with serving(served, limits) as (host, port, server):
        gate = _gate_of(server)

        def hold(sent: int = 5) -> socket.socket:
            sock = socket.create_connection((host, port), timeout=WAIT_S)
            sock.sendall(_post_head(acme, body) + body[:sent])
            return sock

        def settle(open_count: int) -> None:
            deadline = time.monotonic() + WAIT_S
            while (gate.num_open, gate.num_unauthenticated) != (open_count, 0):
                assert time.monotonic() < deadline, (gate.num_open, gate.num_unauthenticated)
                time.sleep(0.02)

        held = []
        for count in range(1, 5):
            held.append(hold())
            settle(count)
        first = socket.create_connection((host, port), timeout=WAIT_S)
        first.sendall(_get_models(served.keys["globex"]))
        deadline = time.monotonic() + WAIT_S
        while gate.num_waiting != 1:  # acme's are busy, none may close: it waits, unread
            assert time.monotonic() < deadline, gate.num_waiting
            time.sleep(0.02)
        drained = gate.num_drained
        for sock in held[:2]:  # acme finishes its two oldest requests, takes their answers
            sock.sendall(body[5:])
            assert _status(sock)[0] == 200
            sock.close()
        first_status = _status(first)[0]  # main: reset at accept
        first.close()
        settle(2)
        reconnects = [hold(len(body)) for _ in range(2)]  # acme's reconnects take the room
        answers = [_status(sock) for sock in reconnects]  # each kept open when answered
        reconnects[0].sendall(_post_head(acme, body) + body)
        again = _status(reconnects[0])  # main: closed after its first 429 (the hog reconnects)
        second = _new_connection_status(host, port, globex)  # a refused one is cut for it
        refused = gate.num_refused
        for sock in held[2:] + reconnects:
            sock.close()
    assert first_status == 200  # let in to the room acme's drained connection freed
    assert second == 200  # main: 0 (reset: acme's reconnects, their bodies due, held the room)
    assert [status for status, _ in answers] == [429, 429]  # main: no answer
    assert again[0] == 429
    error = answers[0][1]["error"]
    assert isinstance(error, dict) and error["code"] == "max_tenant_connection_share"
    assert drained == 2  # main: 1
    assert refused == 2  # acme's two reconnects (main: and globex's first)


def test_a_waiting_newcomer_whose_address_filled_meanwhile_is_not_let_in() -> None:
    # The address's cap was checked only when a newcomer began to wait: two from one address
    # both waited (neither open yet), and both were let in, past max_connections_per_address.
    limits = GateLimits(max_connections=4, max_unauthenticated_connections=4,
                        max_connections_per_address=1)  # fmt: skip
    gate = ConnectionGate(limits, ManualClock())
    hog = [FakeMember(idle=False) for _ in range(4)]
    for number, member in enumerate(hog):
        assert gate.admit(member, f"a{number}") and gate.authenticated(member, "acme")
    first, second = FakeMember(may_wait=True), FakeMember(may_wait=True)
    assert gate.admit(first, "b") and gate.admit(second, "b")  # acme's two oldest drained
    assert gate.num_waiting == 2
    gate.release(hog[0])  # the first takes the room: "b" is at its cap
    assert not first.waiting and not first.body_cut
    refused = gate.num_refused
    gate.release(hog[1])  # the second no longer fits its address: closed, counted refused
    assert second.body_cut and gate.num_waiting == 0
    assert gate.num_refused == refused + 1
    assert gate.num_open == 3  # the room stays free for a newcomer that fits
