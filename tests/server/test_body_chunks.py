"""A chunked request body is held to ``max_body_chunks`` chunks, plus one per KiB of it.

uvicorn appends each chunk to the bytes received so far (``cycle.body += data``: a copy of all
of them), so a tenant's body in 1-byte chunks cost the event loop time quadratic in the chunks
of one socket read: with 2 MB of body (12 MB on the wire), answered only after seconds, every
other request waited about a second at a time. The limit refuses such a body at its first chunk
over the count, before the rest is parsed."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from conftest import Served, make_app_deps
from fakes import FakeEngine
from live import listening

from loraplex.server.app import create_app
from loraplex.server.listeners import ConnectionLimits

MAX_CHUNKS = 16


@pytest.fixture
def address(served: Served) -> Iterator[tuple[str, int]]:
    deps = make_app_deps(served, FakeEngine())
    with listening(create_app(deps), ConnectionLimits(max_body_chunks=MAX_CHUNKS)) as (url, _):
        parts = urlsplit(url)
        yield parts.hostname or "", parts.port or 0
    assert deps.cache is not None
    deps.cache.close()


def _send_chunked(
    address: tuple[str, int], served: Served, chunk_bytes: int, prompt: str = "hi " * 20
) -> bytes:
    body = json.dumps({"model": "support", "prompt": prompt, "max_tokens": 2}).encode()
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: test\r\nConnection: close\r\n"
        f"Authorization: Bearer {served.keys['acme']}\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    pieces = [body[i : i + chunk_bytes] for i in range(0, len(body), chunk_bytes)]
    wire = head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(wire)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def test_a_body_in_more_chunks_than_the_limit_is_refused_naming_it(
    address: tuple[str, int], served: Served
) -> None:
    response = _send_chunked(address, served, chunk_bytes=1)  # about 80 chunks
    assert response.startswith(b"HTTP/1.1 400 ")
    assert b"max_body_chunks" in response and b"16" in response


def test_a_body_within_the_limit_is_served(address: tuple[str, int], served: Served) -> None:
    response = _send_chunked(address, served, chunk_bytes=8)  # about 10 chunks
    assert response.startswith(b"HTTP/1.1 200 "), response[:200]


def test_a_large_body_in_chunks_of_a_kib_is_never_refused(
    address: tuple[str, int], served: Served
) -> None:
    """Each KiB of body allows one more chunk: 24 chunks of 1 KiB pass a limit of 16 (an upload
    of a GiB streamed in 64 KiB chunks must pass the default 4096)."""
    response = _send_chunked(address, served, chunk_bytes=1024, prompt="hi " * 8000)
    assert response.startswith(b"HTTP/1.1 200 "), response[:200]


def test_the_limit_is_validated() -> None:
    with pytest.raises(ValueError, match="max_body_chunks 0 is invalid"):
        ConnectionLimits(max_body_chunks=0)
