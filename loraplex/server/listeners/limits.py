"""What a client connection may hold (``ConnectionLimits``): time for a request head, idle time,
counts, sizes and time to take a response; ``protocol.py`` enforces them."""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.server.connections import GateLimits


@dataclass(frozen=True)
class ConnectionLimits:
    """What client connections may hold: time for a request head, idle time, counts, size, and
    time to take a response (the counts are ``connections.GateLimits``)."""

    header_read_timeout_s: float = 10.0  # a request head must be complete this long after it began
    keep_alive_timeout_s: int = 5  # an idle keep-alive connection is closed after this (uvicorn)
    max_connections: int = 1024  # open connections at most (see ``connections.py``)
    max_header_bytes: int = 16 << 10  # request head buffered before its end: beyond, 400 + close
    linger_s: float = 2.0  # answered mid-body: the rest is read and dropped this long at most
    # open connections with no authenticated request; None: half of ``max_connections``
    max_unauthenticated_connections: int | None = None
    max_connections_per_address: int = 512  # open connections from one client address
    accepts_per_s_per_address: int = 512  # new connections per second from one client address
    write_timeout_s: float = 30.0  # a client that takes no response bytes this long is cut off
    # SO_SNDBUF of every connection (Linux doubles it): what the kernel takes of a response its
    # client has not read; without it, loopback autotuning took about 3 MB of a stuck stream
    # before the server saw any backpressure (``stream_buffer.py``)
    send_buffer_bytes: int = 256 << 10
    # chunks of one chunked request body, plus one per ``CHUNK_ALLOWANCE_BYTES`` of it: beyond,
    # 400 and a close (``h11_bounds.BoundedConnection``); chunks of 1 KiB or more are never
    # refused
    max_body_chunks: int = 4096

    def __post_init__(self) -> None:
        for name in ("header_read_timeout_s", "linger_s", "write_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")
        for name in (
            "keep_alive_timeout_s",
            "max_connections",
            "max_header_bytes",
            "send_buffer_bytes",
            "max_body_chunks",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")
        self.gate()  # checks the counts

    def gate(self) -> GateLimits:
        return GateLimits(
            max_connections=self.max_connections,
            max_unauthenticated_connections=self.max_unauthenticated_connections
            or max(1, self.max_connections // 2),
            max_connections_per_address=self.max_connections_per_address,
            accepts_per_s_per_address=self.accepts_per_s_per_address,
        )
