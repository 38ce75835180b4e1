"""The accept-rate check of the connection gate, before uvicorn's protocol exists.

uvicorn builds its h11 protocol for every accepted connection (an h11 state machine, the
connection's addresses, its timers) and tears it down again when the connection is closed: about
65-105 µs of the server's CPU for each connection refused at ``accepts_per_s_per_address``
(docs/benchmarks/serve.md). Issue 25's half-open flood reopened ~4,000 connections a second,
most of them past the rate. ``AcceptGate`` is the protocol the server makes for each accepted
connection instead: it takes the address's accept token first and holds a connection past the
rate in the tarpit (``tarpit.py``: reset later, so its client does not reconnect at once); only
an accepted one gets the real protocol, which takes the transport over and applies the caps
(connections in all, per address, not yet authenticated), which need the connection itself to
count it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from loraplex.server.connections import ConnectionGate
from loraplex.server.tarpit import Tarpit, refuse

__all__ = ["AcceptGate", "refuse"]


class AcceptGate(asyncio.Protocol):
    """What the listener makes per accepted connection: the accept-rate check, then the real
    protocol (built by ``make``, told the token is taken) for a connection within the rate."""

    def __init__(
        self, gate: ConnectionGate, make: Callable[[], asyncio.Protocol], tarpit: Tarpit
    ) -> None:
        self._gate = gate
        self._make = make
        self._tarpit = tarpit
        self._held: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer: Any = transport.get_extra_info("peername")
        host = peer[0] if isinstance(peer, tuple) and peer else ""
        if not self._gate.accept(host):
            self._held = transport
            self._tarpit.hold(transport)  # not reset at once: a flood would only reconnect
            return
        protocol = self._make()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        """Only a held connection gets here (an admitted one has its own protocol)."""
        if self._held is not None:
            self._tarpit.forget(self._held)
            self._held = None
