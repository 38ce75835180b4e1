"""A client taking a large answer that waits for it (``listeners/unsent.py``), through the real
listener: it must take ``min_send_bytes_per_s`` over each ``write_timeout_s`` of what waits, or
is cut with a reset; an honest client reading steadily above that pace gets its whole answer
however long it takes; all waiting answers together are held to ``max_unsent_response_bytes``,
the slowest client cut first.

Before, the write timer ran until the transport drained: a non-streamed answer had to be taken
whole within ``write_timeout_s`` (a client reading 100 KB/s was cut from a 600 KB answer at a
2 s timeout), and a cut closed the socket without a reset, so the kernel went on handing the
slow client what its send buffer held."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from live import listening
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from loraplex.server.listeners import ConnectionLimits

SEND_BUFFER_BYTES = 16 << 10  # small kernel buffers: the transport holds the answer at once
WAIT_S = 60.0


async def _answer(request: Request) -> Response:
    return Response(b"x" * int(request.query_params["bytes"]))


@pytest.fixture
def serve() -> Iterator[object]:
    yield from serving(Starlette(routes=[Route("/", _answer)]))


def serving(app: Starlette) -> Iterator[object]:
    """A fixture's body: yields ``serve(limits)``, the address and /metrics registry of a
    listener of ``app`` with ``limits``; every listener started is stopped afterwards."""
    with_limits: list[object] = []

    def start(**limits: float) -> tuple[tuple[str, int], CollectorRegistry]:
        registry = CollectorRegistry()
        context = listening(
            app, ConnectionLimits(send_buffer_bytes=SEND_BUFFER_BYTES, **limits), registry
        )  # type: ignore[arg-type]
        url, _ = context.__enter__()
        with_limits.append(context)
        parts = urlsplit(url)
        return (parts.hostname or "", parts.port or 0), registry

    yield start
    for context in with_limits:
        context.__exit__(None, None, None)  # type: ignore[attr-defined]


def _read(address: tuple[str, int], num_bytes: int, pace: float, first_wait_s: float = 0.0):
    """Asks for an answer of ``num_bytes`` and reads it at ``pace`` bytes a second after
    ``first_wait_s``; (bytes read, how it ended: "eof" or "reset")."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
        sock.settimeout(WAIT_S)
        sock.connect(address)
        sock.sendall(b"GET /?bytes=%d HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n" % num_bytes)
        time.sleep(first_wait_s)
        received, started = 0, time.monotonic()
        try:
            while chunk := sock.recv(4096):
                received += len(chunk)
                ahead_s = received / pace - (time.monotonic() - started)
                if ahead_s > 0:
                    time.sleep(ahead_s)
        except ConnectionResetError:
            return received, "reset"
    return received, "eof"


def _cut(registry: CollectorRegistry, reason: str) -> float:
    value = registry.get_sample_value("loraplex_connections_cut_total", {"reason": reason})
    return value or 0.0


def test_a_client_reading_steadily_above_the_pace_gets_its_whole_answer(serve) -> None:
    """600 KB at 100 KB/s takes 6 s, three times ``write_timeout_s``: before, cut after 2 s."""
    address, registry = serve(write_timeout_s=2.0)  # 32 KiB per 2 s at the default pace
    received, ended = _read(address, 600_000, pace=100_000)
    assert (ended, _cut(registry, "write_timeout")) == ("eof", 0)
    assert received > 600_000  # the head too


def test_a_client_taking_less_than_the_pace_is_cut_with_a_reset(serve) -> None:
    """Before, the server closed the socket at the timeout and the kernel went on handing the
    client what its buffers held, then an orderly end."""
    address, registry = serve(write_timeout_s=1.0)
    received, ended = _read(address, 2_000_000, pace=1_000_000, first_wait_s=3.0)
    assert ended == "reset" and received < 2_000_000
    assert _cut(registry, "write_timeout") == 1


def test_past_the_unsent_cap_the_slowest_client_is_cut_and_the_others_served(serve) -> None:
    """A slow client holds 2 MB; a second answer of 1 MB takes the unsent answers past 2.5 MB:
    the slow client, held longer than a ``write_timeout_s``, is cut, the other served whole."""
    address, registry = serve(
        write_timeout_s=1.0, min_send_bytes_per_s=0, max_unsent_response_bytes=2_500_000
    )
    slow: list[tuple[int, str]] = []
    thread = threading.Thread(target=lambda: slow.append(_read(address, 2_000_000, 64_000)))
    thread.start()
    time.sleep(2.5)  # held for more than a write_timeout_s: its pace counts
    received, ended = _read(address, 1_000_000, pace=100_000_000)
    thread.join(WAIT_S)
    assert (ended, received > 1_000_000) == ("eof", True)
    assert slow[0][1] == "reset" and slow[0][0] < 2_000_000
    assert _cut(registry, "unsent_bytes") == 1


@pytest.mark.parametrize(
    ("name", "value"), [("min_send_bytes_per_s", -1), ("max_unsent_response_bytes", 0)]
)
def test_the_limits_are_validated(name: str, value: int) -> None:
    with pytest.raises(ValueError, match=f"{name} {value} is invalid"):
        ConnectionLimits(**{name: value})
