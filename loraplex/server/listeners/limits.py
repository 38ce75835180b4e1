"""What a client connection may hold (``ConnectionLimits``): time for a request head, idle time,
counts, sizes and the time and pace to take a response; ``protocol.py`` enforces them."""

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
    # the fraction of ``max_connections`` one tenant may hold while newcomers are turned away
    max_tenant_connection_share: float = 0.5
    # an IPv6 client counts for the per-address bounds as its network of this prefix length
    ipv6_address_prefix: int = 64
    # a client that takes less of its waiting answer than ``min_send_bytes_per_s`` x this, in
    # any such span, is cut off with a reset (``protocol.py``)
    write_timeout_s: float = 30.0
    # the slowest pace, bytes a second over each ``write_timeout_s``, at which a client may take
    # an answer that waits for it; 0: any byte taken in each span will do (nginx's send_timeout)
    min_send_bytes_per_s: int = 16 << 10
    # answer bytes waiting for their clients in all connections' transports; beyond it the
    # slowest are cut (``unsent.UnsentLedger``)
    max_unsent_response_bytes: int = 256 << 20
    # SO_SNDBUF of every connection (Linux doubles it): what the kernel takes of a response its
    # client has not read; without it, loopback autotuning took about 3 MB of a stuck stream
    # before the server saw any backpressure (``stream_buffer.py``)
    send_buffer_bytes: int = 256 << 10
    # chunks of one chunked request body, plus one per ``CHUNK_ALLOWANCE_BYTES`` of it: beyond,
    # 400 and a close (``h11_bounds.BoundedConnection``); chunks of 1 KiB or more are never
    # refused
    max_body_chunks: int = 4096
    # header lines of one request head (or trailer section), counted before h11 parses them:
    # beyond, 431 and a close (``h11_bounds.BoundedConnection``)
    max_header_count: int = 100

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
            "max_header_count",
            "max_unsent_response_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")
        if self.min_send_bytes_per_s < 0:
            raise ValueError(
                f"min_send_bytes_per_s {self.min_send_bytes_per_s} is invalid; expected >= 0"
            )
        self.gate()  # checks the counts

    def gate(self) -> GateLimits:
        return GateLimits(
            max_connections=self.max_connections,
            max_unauthenticated_connections=self.max_unauthenticated_connections
            or max(1, self.max_connections // 2),
            max_connections_per_address=self.max_connections_per_address,
            accepts_per_s_per_address=self.accepts_per_s_per_address,
            max_tenant_connection_share=self.max_tenant_connection_share,
            ipv6_address_prefix=self.ipv6_address_prefix,
        )
