"""The staged close of a connection answered before its request body ended (a 413 past the body
cap, a 401 before the body is read), as RFC 9112 §9.6 asks: the answer is sent and the write side
shut, then what the client still sends is read and dropped until it closes its side, for
``linger_s`` at most. Closing at once with unread bytes in the socket makes the kernel send a
reset, which can destroy the answer before the client read it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import h11


class _Parsing(Protocol):
    """What the transport reads of its protocol (``protocol.BoundedH11Protocol``)."""

    @property
    def conn(self) -> h11.Connection: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...


class LingeringTransport:
    """The connection's transport, whose ``close`` lingers while the client is mid-body.

    uvicorn closes the transport itself once a ``Connection: close`` answer is written, so the
    staged close has to sit under it: here the write side is shut at once (the answer is flushed,
    then a FIN), and the socket is closed when the client's FIN arrives (asyncio closes a
    transport whose protocol's ``eof_received`` returns false) or after ``linger_s``.
    """

    def __init__(self, transport: asyncio.Transport, protocol: _Parsing, linger_s: float) -> None:
        self._transport = transport
        self._protocol = protocol
        self._linger_s = linger_s
        self.lingering = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def close(self) -> None:
        mid_body = self._protocol.conn.their_state is h11.SEND_BODY
        if self.lingering or not mid_body or not self._transport.can_write_eof():
            self._transport.close()
            return
        self.lingering = True
        self._transport.write_eof()
        self._transport.resume_reading()  # uvicorn's flow control may have paused it
        self._protocol.loop.call_later(self._linger_s, self._transport.close)
