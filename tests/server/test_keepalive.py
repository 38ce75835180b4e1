"""A reused keep-alive connection answers at once: accepted sockets run with TCP_NODELAY.

``loraplex serve`` binds its own sockets (``socket.create_server``, ``proto`` 0), which asyncio
does not give TCP_NODELAY; every response on a reused connection then waited out the client's
delayed ACK (~40 ms on Linux). The test checks the option on the accepted socket of a
connection reused for many requests; how long a round trip takes is a benchmark's business
(non-negotiable 5: a wall-clock bound here failed under load), not a test's.
"""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import uvicorn
from conftest import Served, make_app_deps
from fakes import FakeEngine
from live import listening

from loraplex.server.app import create_app
from loraplex.server.listeners import BoundedH11Protocol, ConnectionLimits

NUM_REQUESTS = 30


@pytest.fixture
def server(served: Served) -> Iterator[tuple[str, uvicorn.Server]]:
    deps = make_app_deps(served, FakeEngine())
    with listening(create_app(deps), ConnectionLimits()) as running:
        yield running
    assert deps.cache is not None
    deps.cache.close()


def test_a_reused_keep_alive_connection_runs_with_tcp_nodelay(
    server: tuple[str, uvicorn.Server], served: Served
) -> None:
    url, uvicorn_server = server
    address = urlsplit(url)
    conn = http.client.HTTPConnection(address.hostname or "", address.port, timeout=10)
    headers = {"Authorization": f"Bearer {served.keys['acme']}"}
    try:
        for _ in range(NUM_REQUESTS):
            conn.request("GET", "/v1/models", headers=headers)
            response = conn.getresponse()
            assert response.status == 200 and b"loraplex-demo-small" in response.read()
        (protocol,) = uvicorn_server.server_state.connections  # the one reused connection
        assert isinstance(protocol, BoundedH11Protocol)
        accepted = protocol.transport.get_extra_info("socket")
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        conn.close()
