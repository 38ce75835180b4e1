"""A request asking to switch protocols (``Upgrade: websocket``, ``h2c``) is answered over
HTTP/1.1, and its connection leaves the gate when it closes (hostile client, attack round 16).

uvicorn upgraded a WebSocket request, needing no credential, to its WebSocket protocol and
handed the connection over without ``BoundedH11Protocol.connection_lost``: the gate never
released it. Each such request was answered 403 and closed, and yet counted as an open
unauthenticated connection for good; about 500 of them from one client filled the gate, and
the server admitted no connection again (``/health`` timed out)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from live import exchange, listening
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from loraplex.server.listeners import ConnectionLimits

NUM_CONNECTIONS = 6  # the gate's bound here (3 unauthenticated); each request opens one


async def _hello(request: Request) -> Response:
    return Response(f"hello {request.scope['type']}")


@pytest.fixture
def served() -> Iterator[tuple[tuple[str, int], CollectorRegistry]]:
    app = Starlette(routes=[Route("/", _hello)])
    registry = CollectorRegistry()
    limits = ConnectionLimits(max_connections=NUM_CONNECTIONS)
    with listening(app, limits, registry) as (url, _):
        parts = urlsplit(url)
        yield (parts.hostname or "", parts.port or 0), registry


def _open(registry: CollectorRegistry) -> float:
    """Connections the gate counts as open, once the server has seen the closes."""
    deadline = time.monotonic() + 10
    while True:
        count = sum(
            registry.get_sample_value("loraplex_connections", {"state": state}) or 0.0
            for state in ("authenticated", "unauthenticated")
        )
        if count == 0 or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


WEBSOCKET = (
    b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
)
H2C = b"Upgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n"


@pytest.mark.parametrize("upgrade", [WEBSOCKET, H2C])
def test_an_upgrade_request_is_answered_over_http_and_leaves_the_gate(
    served: tuple[tuple[str, int], CollectorRegistry], upgrade: bytes
) -> None:
    address, registry = served
    request = b"GET / HTTP/1.1\r\nHost: t\r\n" + upgrade + b"\r\n"
    responses = [_answer(address, request) for _ in range(NUM_CONNECTIONS)]
    assert _open(registry) == 0  # on main: 3 (the unauthenticated half), each kept its place
    plain = _answer(address, b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    assert plain.startswith(b"HTTP/1.1 200 "), plain[:100]  # on main: refused, the gate full
    for response in responses:
        assert response.startswith(b"HTTP/1.1 200 "), response[:100]
        assert response.endswith(b"hello http")


def _answer(address: tuple[str, int], request: bytes) -> bytes:
    try:
        return exchange(address, request, half_close=True)
    except OSError:  # not admitted: reset
        return b""
