"""How a request body is framed (hostile tenant, attack round 16).

- A request declaring both ``Transfer-Encoding`` and ``Content-Length`` is a 400 and a close
  (RFC 9112 §6.3: a likely request smuggling attempt). h11 framed it by ``Transfer-Encoding``
  and kept the connection, so the bytes a proxy framing by ``Content-Length`` took for the next
  request's were served as one: a second request rode in the first one's body.
- A chunked body's chunk extensions are bounded in all (``max_header_bytes``, as Node.js bounds
  them to 16 KiB since CVE-2024-22019). Only each size line was: a body of a few bytes in 4,096
  chunks carried 64 MiB of extensions, far past ``max_body_bytes``, received and parsed on the
  event loop, and h11 dropped them unread.
"""

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
from loraplex.server.listeners.unsent import BOTH_FRAMINGS, MALFORMED

MAX_HEADER_BYTES = 1024


async def _echo(request: Request) -> Response:
    body = await request.body()
    return Response(f"{request.url.path} body {len(body)}")


@pytest.fixture
def served() -> Iterator[tuple[tuple[str, int], CollectorRegistry]]:
    app = Starlette(routes=[Route("/", _echo, methods=["POST"]), Route("/next", _echo)])
    registry = CollectorRegistry()
    limits = ConnectionLimits(max_header_bytes=MAX_HEADER_BYTES)
    with listening(app, limits, registry) as (url, _):
        parts = urlsplit(url)
        yield (parts.hostname or "", parts.port or 0), registry


def _exchange(address: tuple[str, int], wire: bytes) -> bytes:
    return exchange(address, wire, half_close=True)  # answered, then closed


def _chunked(chunks: list[bytes], extension: bytes = b"", framing: bytes = b"") -> bytes:
    head = b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n" + framing + b"\r\n"
    lines = b"".join(b"%x%s\r\n%s\r\n" % (len(c), extension, c) for c in chunks)
    return head + lines + b"0\r\n\r\n"


NEXT = b"GET /next HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"


def test_transfer_encoding_with_content_length_is_refused_and_closed(
    served: tuple[tuple[str, int], CollectorRegistry],
) -> None:
    address, registry = served
    assert _refused_both(registry) == 0
    wire = _chunked([b"hello"], framing=b"Content-Length: 4\r\n")
    response = _exchange(address, wire + NEXT)
    assert response.startswith(b"HTTP/1.1 400 "), response[:100]
    assert b"both Transfer-Encoding and Content-Length" in response
    assert b"/next" not in response  # the request behind it is never served
    assert response.count(b"HTTP/1.1 ") == 1
    # counted as the parser's other refusals are (it was not: no setting refuses it)
    assert _refused_both(registry) == 1
    scraped = generate_latest(registry).decode()
    assert 'loraplex_http_refused_total{setting="both_framings"} 1.0' in scraped


def _refused_both(registry: CollectorRegistry) -> float | None:
    labels = {"setting": BOTH_FRAMINGS}
    return registry.get_sample_value("loraplex_http_refused_total", labels)


def test_each_framing_alone_is_served_and_kept_alive(
    served: tuple[tuple[str, int], CollectorRegistry],
) -> None:
    address, registry = served
    response = _exchange(address, _chunked([b"hello"]) + NEXT)
    assert response.count(b"HTTP/1.1 200 ") == 2, response
    assert b"/ body 5" in response and b"/next body 0" in response
    sized = b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello"
    response = _exchange(address, sized + NEXT)
    assert response.count(b"HTTP/1.1 200 ") == 2, response
    assert _refused_both(registry) == 0


def test_chunk_extensions_past_max_header_bytes_in_all_are_refused(
    served: tuple[tuple[str, int], CollectorRegistry],
) -> None:
    """Each line is within the bound; together they are not."""
    address, registry = served
    extension = b";" + b"x" * 200
    response = _exchange(address, _chunked([b"a"] * 8, extension))
    assert response.startswith(b"HTTP/1.1 400 "), response[:100]
    assert b"chunk extensions of more than 1024 bytes" in response
    assert b"max_header_bytes" in response
    labels = {"setting": "max_header_bytes"}
    assert registry.get_sample_value("loraplex_http_refused_total", labels) == 1


def test_chunk_extensions_within_the_bound_are_served(
    served: tuple[tuple[str, int], CollectorRegistry],
) -> None:
    address, _ = served
    extension = b";name=" + b"x" * 100  # 106 bytes a line, 954 in all
    response = _exchange(address, _chunked([b"a"] * 9, extension))
    assert response.startswith(b"HTTP/1.1 200 "), response[:100]
    assert response.endswith(b"/ body 9")


def test_size_lines_without_extensions_never_count(
    served: tuple[tuple[str, int], CollectorRegistry],
) -> None:
    """Many more chunks than ``max_header_bytes``: their sizes and line ends are not extensions
    (an upload in KiB chunks must pass whatever its length)."""
    address, _ = served
    response = _exchange(address, _chunked([b"abcd"] * 2000))
    assert response.startswith(b"HTTP/1.1 200 "), response[:100]
    assert response.endswith(b"/ body 8000")


@pytest.mark.parametrize(
    "wire",
    [
        b"NOT AN HTTP REQUEST\r\n\r\n",  # a malformed request line
        b"GET / HTTP/1.1\r\nHost t\r\n\r\n",  # a header line without a colon
        b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: x\r\n\r\n",  # an invalid length
        b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # chunk size
    ],
)
def test_what_h11_itself_refuses_is_counted_as_malformed(
    served: tuple[tuple[str, int], CollectorRegistry], wire: bytes
) -> None:
    """uvicorn's own 400 for a request h11 cannot parse, answered before the app runs, was the
    one parser refusal ``loraplex_http_refused_total`` did not count."""
    address, registry = served
    labels = {"setting": MALFORMED}
    assert registry.get_sample_value("loraplex_http_refused_total", labels) == 0
    response = _exchange(address, wire + NEXT)
    assert response.startswith(b"HTTP/1.1 400 "), response[:100]
    assert b"/next" not in response  # closed: nothing behind it is served
    assert registry.get_sample_value("loraplex_http_refused_total", labels) == 1
    for setting in ("max_header_bytes", "max_header_count", BOTH_FRAMINGS):  # only that one
        assert registry.get_sample_value("loraplex_http_refused_total", {"setting": setting}) == 0
