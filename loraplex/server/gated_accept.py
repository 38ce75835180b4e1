"""The accept-rate check of the connection gate, before uvicorn's protocol exists.

uvicorn builds its h11 protocol for every accepted connection (an h11 state machine, the
connection's addresses, its timers) and tears it down again when the connection is closed: about
65-105 µs of the server's CPU for each connection refused at ``accepts_per_s_per_address``
(docs/benchmarks/serve.md). Issue 25's half-open flood reopened ~4,000 connections a second,
most of them past the rate. ``AcceptGate`` is the protocol the server makes for each accepted
connection instead: it takes the address's accept token first and resets a connection past the
rate (``SO_LINGER`` 0: no ``TIME_WAIT`` left behind for each); only an accepted one gets the
real protocol, which takes the transport over and applies the caps (connections in all, per
address, not yet authenticated), which need the connection itself to count it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable
from typing import Any

from loraplex.server.connections import ConnectionGate

_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close sends a reset


def refuse(transport: asyncio.BaseTransport) -> None:
    """Closes a just-accepted connection with a reset (``abort``: nothing is flushed)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):  # already reset by the client: as cheap
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    transport.abort()  # type: ignore[attr-defined]


class AcceptGate(asyncio.Protocol):
    """What the listener makes per accepted connection: the accept-rate check, then the real
    protocol (built by ``make``, told the token is taken) for a connection within the rate."""

    def __init__(self, gate: ConnectionGate, make: Callable[[], asyncio.Protocol]) -> None:
        self._gate = gate
        self._make = make

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer: Any = transport.get_extra_info("peername")
        host = peer[0] if isinstance(peer, tuple) and peer else ""
        if not self._gate.accept(host):
            refuse(transport)
            return
        protocol = self._make()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
