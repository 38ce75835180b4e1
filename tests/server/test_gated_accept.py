"""The accept-rate check before uvicorn's protocol exists (``server/gated_accept.py``): a
connection past the rate is held and then reset (``server/tarpit.py``) without the real protocol
ever being built for it, and one within the rate is handed to the real protocol, which then owns
the transport."""

from __future__ import annotations

import asyncio
import socket

from loraplex.clock import ManualClock
from loraplex.server.connections import ConnectionGate, GateLimits
from loraplex.server.gated_accept import AcceptGate
from loraplex.server.tarpit import Tarpit

WAIT_S = 5.0


class Echo(asyncio.Protocol):
    """The "real" protocol: echoes what it receives."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


async def _exchange(port: int) -> bytes | None:
    """What the server echoes to ``ping``; None when it reset the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"ping")
        return await asyncio.wait_for(reader.read(4), WAIT_S) or None
    except ConnectionResetError:
        return None
    finally:
        writer.close()


def test_connections_past_the_accept_rate_are_held_then_reset_before_the_protocol_is_built() -> (
    None
):
    clock = ManualClock()  # frozen: no token comes back during the test
    gate = ConnectionGate(GateLimits(accepts_per_s_per_address=3), clock)
    tarpit = Tarpit(hold_s=0.2)  # short: each held exchange ends in its reset within a second
    built: list[Echo] = []

    def make() -> Echo:
        built.append(Echo())
        return built[-1]

    async def run() -> list[bytes | None]:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: AcceptGate(gate, make, tarpit), "127.0.0.1", 0, family=socket.AF_INET
        )
        port = server.sockets[0].getsockname()[1]
        try:
            return [await _exchange(port) for _ in range(7)]
        finally:
            server.close()
            await server.wait_closed()

    answers = asyncio.run(run())
    assert answers == [b"ping"] * 3 + [None] * 4  # served by the real protocol, then reset
    assert len(built) == 3  # never built for a refused connection
    assert gate.num_refused == 4
    assert tarpit.num_held == 4 and len(tarpit) == 0  # each held, then reset and forgotten
    assert gate.num_open == 0  # the token alone admits nobody: the real protocol's caps do
