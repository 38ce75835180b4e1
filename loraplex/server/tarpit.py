"""Connections held off instead of reset: a connection past its address's accept rate
(``connections.ConnectionGate.accept``) is accepted and then gets nothing: no protocol, nothing
read, nothing written, until ``HOLD_S`` later it is reset (``SO_LINGER`` 0: no ``TIME_WAIT``).

Why not reset at once: a flooding client reopens what the server closes, so every reset bought
another handshake a few milliseconds later (``bench serve``'s ``half-open-flood``: 1,100 sockets
reopened 50 ms after each close made about 2,300 connection attempts a second, whose kernel and
client work on the shared cores slowed every tenant). Held, a socket costs a file descriptor and
an entry here, and its client waits. At most ``MAX_HELD`` are held; past that a newcomer is reset
at once, as before. NOTE: reading is paused, so a held connection whose client closes it first
is not noticed: it stays held (one file descriptor) until its reset, at most ``HOLD_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections import OrderedDict

HOLD_S = 10.0  # how long a held connection waits before its reset
MAX_HELD = 1024  # connections held at most (each is one file descriptor)
_SWEEP_S = 0.5  # how often expired holds are reset
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close sends a reset


def refuse(transport: asyncio.BaseTransport) -> None:
    """Closes a just-accepted connection with a reset (``abort``: nothing is flushed)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):  # already reset by the client: as cheap
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    transport.abort()  # type: ignore[attr-defined]


class Tarpit:
    """The held connections, oldest first; event-loop thread only."""

    def __init__(self, hold_s: float = HOLD_S, max_held: int = MAX_HELD) -> None:
        self.hold_s = hold_s
        self.max_held = max_held
        self._held: OrderedDict[asyncio.BaseTransport, float] = OrderedDict()  # -> reset at
        self._sweep: asyncio.TimerHandle | None = None
        self.num_held = 0  # connections held so far (a counter)

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, transport: asyncio.BaseTransport) -> None:
        """Holds ``transport`` (reads paused) until ``hold_s`` from now; resets it at once when
        ``max_held`` are held already."""
        if len(self._held) >= self.max_held:
            refuse(transport)
            return
        if isinstance(transport, asyncio.ReadTransport):
            transport.pause_reading()
        loop = asyncio.get_running_loop()
        self._held[transport] = loop.time() + self.hold_s
        self.num_held += 1
        if self._sweep is None:
            self._sweep = loop.call_later(_SWEEP_S, self._reset_expired)

    def forget(self, transport: asyncio.BaseTransport) -> None:
        """``transport`` closed (by its client, or reset here): no longer held."""
        self._held.pop(transport, None)

    def _reset_expired(self) -> None:
        self._sweep = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._held:
            transport, until = next(iter(self._held.items()))
            if until > now:
                break
            del self._held[transport]
            refuse(transport)
        if self._held:
            self._sweep = loop.call_later(_SWEEP_S, self._reset_expired)
