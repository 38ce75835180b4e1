"""The places where newcomers wait for a drained connection's room (``connections.py``: one per
drained connection) go to those who can use them.

Attack round 20 (``scripts/attacks/attack20/waiter-squat``): a tenant holding every connection
with a stream in flight, and a squatter opening connections that took every waiting place: a
waiting newcomer is read only when its turn comes, so one its client had already closed (reset
or shut) held its place until its head deadline, and another tenant's newcomers were refused
meanwhile (on asyncio's loop; uvloop saw the close)."""

from __future__ import annotations

import socket
import struct
import sys
from typing import Any

import pytest
from conftest import Served
from test_connection_share import _busy, _gate
from test_connections import FakeMember, _gate_of
from test_eviction_race import WAIT_S, _answer, _head, _hog, _post, _protocol_of, _wait

from loraplex.server.listeners import ConnectionLimits

ESTABLISHED = 1  # Linux's TCP state of an open connection (the first byte of TCP_INFO)


def test_a_waiting_place_whose_newcomer_left_goes_to_the_next() -> None:
    gate, _ = _gate(4)
    _busy(gate, "acme", 4)
    first, second = FakeMember(may_wait=True), FakeMember(may_wait=True)
    assert gate.admit(first, "b") and gate.admit(second, "c")  # both places taken
    first.left = True  # its client closed it: nothing of it was read
    late = FakeMember(may_wait=True)
    assert gate.admit(late, "d") and late.waiting  # main: refused, both places held
    assert first.body_cut and not second.body_cut
    assert (gate.num_waiting, gate.num_refused) == (2, 0)


def _closed_or_closing(sock: Any) -> bool:
    """Whether the server's end of a connection saw its client's close: its TCP state left
    ESTABLISHED, or the server closed the socket already. NOTE: under uvloop the server may close
    it before the test asks, and a closed socket's TCP_INFO is a ValueError (fd -1: once in CI
    on a 2-core machine), not a state."""
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != ESTABLISHED
    except (ValueError, OSError):
        return True


@pytest.mark.parametrize("loop", ["asyncio", "auto"])
@pytest.mark.parametrize("close", ["reset", "shut"])
def test_a_waiting_newcomer_its_client_closed_leaves_its_place_to_the_next(
    served: Served, close: str, loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``asyncio``: asyncio's own loop, what an install without uvloop (not a dependency) runs;
    it reads nothing of a waiting newcomer, so main saw neither close. uvloop (``auto``, where
    installed) saw both on main too."""
    if loop == "asyncio":
        monkeypatch.setitem(sys.modules, "uvloop", None)  # uvicorn's "auto" then takes asyncio
    limits = ConnectionLimits(max_connections=2, max_connections_per_address=8)
    with _hog(served, limits) as (address, (server, first, second)):
        request = _post(served.keys["acme"])
        for sock in (first, second):  # a request in flight on each: neither may close
            sock.sendall(request[:20])
            proto = _protocol_of(server, sock)
            _wait(lambda p=proto: bool(p.conn.trailing_data[0]))  # type: ignore[misc]
        gate = _gate_of(server)
        gone = socket.create_connection(address, timeout=WAIT_S)
        _wait(lambda: gate.num_waiting == 1)  # the one drained connection's place
        (waiter,) = gate._waiting
        if close == "reset":
            gone.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        gone.close()
        sock = waiter.transport.get_extra_info("socket")  # its end reached the server's socket
        _wait(lambda: _closed_or_closing(sock))
        newcomer = socket.create_connection(address, timeout=WAIT_S)
        port = newcomer.getsockname()[1]
        newcomer.sendall(_head("GET", "/v1/models", served.keys["globex"]))
        ports = lambda: [getattr(m, "client", (0, 0))[1] for m in gate._waiting]  # noqa: E731
        _wait(lambda: port in ports() or gate.num_refused > 0)  # main: refused, reset at accept
        first.sendall(request[20:])  # answered, then closed: the newcomer's room
        assert _answer(first)[0] == 200
        assert _answer(newcomer)[0] == 200
        assert gate.num_refused == 0
