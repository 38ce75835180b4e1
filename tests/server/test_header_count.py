"""The request head's header lines are counted before h11 parses them (``max_header_count``):
one over gets 431 naming the setting and a close, counted in ``/metrics``. Before, h11 parsed
every line of a head within ``max_header_bytes`` (3,000 tiny headers cost ~30 ms of the event
loop per request). A chunked body's trailer section is a head too (h11 parsed it and uvicorn
dropped it), and a chunk's size line arriving whole in one read was never measured."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from live import exchange, listening
from prometheus_client import CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from loraplex.server.listeners import ConnectionLimits

MAX_HEADERS = 100  # the default


async def _echo(request: Request) -> Response:
    body = await request.body()
    return Response(f"headers {len(request.headers)} body {len(body)}")


@pytest.fixture
def served() -> Iterator[tuple[tuple[str, int], CollectorRegistry]]:
    app = Starlette(routes=[Route("/", _echo, methods=["GET", "POST"])])
    registry = CollectorRegistry()
    with listening(app, ConnectionLimits(), registry) as (url, _):
        parts = urlsplit(url)
        yield (parts.hostname or "", parts.port or 0), registry


def _head(num_headers: int) -> bytes:
    """A GET whose head has ``num_headers`` header lines (Host and Connection among them)."""
    extra = b"".join(b"x%d: y\r\n" % i for i in range(num_headers - 2))
    return b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n" + extra + b"\r\n"


def _chunked(trailers: bytes, size_line: bytes = b"5") -> bytes:
    head = b"POST / HTTP/1.1\r\nHost: t\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + size_line + b"\r\nhello\r\n0\r\n" + trailers + b"\r\n"


def _refused(registry: CollectorRegistry, setting: str) -> float:
    value = registry.get_sample_value("loraplex_http_refused_total", {"setting": setting})
    return value or 0.0


def test_a_head_of_more_header_lines_than_the_limit_is_refused_431(
    served: tuple[tuple[str, int], CollectorRegistry],
) -> None:
    address, registry = served
    response = exchange(address, _head(MAX_HEADERS + 1))
    assert response.startswith(b"HTTP/1.1 431 "), response[:100]
    assert b"101 header lines exceeds max_header_count 100" in response
    assert _refused(registry, "max_header_count") == 1
    assert b"loraplex_http_refused_total" in generate_latest(registry)


def test_a_head_at_the_limit_is_served(
    served: tuple[tuple[str, int], CollectorRegistry],
) -> None:
    address, registry = served
    response = exchange(address, _head(MAX_HEADERS))
    assert response.startswith(b"HTTP/1.1 200 "), response[:100]
    assert response.endswith(b"headers 100 body 0")
    assert _refused(registry, "max_header_count") == 0


def test_trailers_are_held_to_the_header_count_too(
    served: tuple[tuple[str, int], CollectorRegistry],
) -> None:
    address, _ = served
    few = b"".join(b"t%d: v\r\n" % i for i in range(3))
    assert exchange(address, _chunked(few)).endswith(b"body 5")
    many = b"".join(b"t%d: v\r\n" % i for i in range(MAX_HEADERS + 1))
    response = exchange(address, _chunked(many))
    assert response.startswith(b"HTTP/1.1 431 "), response[:100]
    assert b"trailer section of 101 header lines exceeds max_header_count" in response


def test_a_chunk_size_line_sent_whole_is_held_to_max_header_bytes(
    served: tuple[tuple[str, int], CollectorRegistry],
) -> None:
    """h11 measures only a line still waiting for its end: a 20 KB chunk extension sent in one
    piece passed."""
    address, registry = served
    response = exchange(address, _chunked(b"", size_line=b"5;" + b"e" * 20_000))
    assert response.startswith(b"HTTP/1.1 400 "), response[:100]
    assert b"chunk size line of more than 16384 bytes exceeds max_header_bytes" in response
    assert _refused(registry, "max_header_bytes") == 1


def test_the_limit_is_validated() -> None:
    with pytest.raises(ValueError, match="max_header_count 0 is invalid"):
        ConnectionLimits(max_header_count=0)
