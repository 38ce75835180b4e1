"""A stream's buffered answer bytes count toward ``max_unsent_response_bytes``
(``listeners/buffered.py``), through the real listener.

A stream hands its transport one slice at a time (``stream_buffer.bounded``): what its client
has not taken waits in its read-ahead buffer and in the piece being sliced. Before, the cap saw
only the slice, so streams of echo events (not counted by ``max_stream_buffer_bytes``: 4.68 MB
for 16 choices of a 483-token prompt with ``logprobs: 20`` on the demo model) added up past it
with nothing cut, where the same answers non-streamed were held to it (attack round 17)."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route
from test_slow_answer import WAIT_S, _cut, _read, serving

from loraplex.server.listeners.buffered import buffered_answers
from loraplex.server.stream_buffer import EchoEvent, bounded


async def _stream(request: Request) -> StreamingResponse:
    """One echo event of ``bytes`` (uncounted by the read-ahead bound), as a stream."""
    num_bytes = int(request.query_params["bytes"])

    async def events() -> AsyncIterator[str]:
        yield EchoEvent("x" * num_bytes)

    async def abort() -> None:
        return None

    held = buffered_answers(request.scope.get("state", {}))
    return StreamingResponse(bounded(events(), 64 << 10, lambda _: "", abort, held=held))


@pytest.fixture
def serve() -> Iterator[object]:
    """``serve(limits)``: the address and /metrics registry of a listener with ``limits``."""
    yield from serving(Starlette(routes=[Route("/", _stream)]))


def test_past_the_unsent_cap_the_slowest_stream_is_cut_and_the_others_served(serve) -> None:
    """A slow stream's client holds 2 MB, nearly all of it in the stream's buffer; a second
    stream of 1 MB takes the waiting answers past 2.5 MB: the slow one, held longer than a
    ``write_timeout_s``, is cut, the other served whole. Before, the slow one counted its
    transport's slice only: nothing was cut and both were served."""
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


def test_a_stream_alone_always_fits_and_a_steady_reader_gets_it_whole(serve) -> None:
    """One answer alone always fits, streamed as non-streamed: 3 MB past a 2.5 MB cap, read
    at 1 MB/s (a pace far above ``min_send_bytes_per_s``), arrives whole."""
    address, registry = serve(write_timeout_s=1.0, max_unsent_response_bytes=2_500_000)
    received, ended = _read(address, 3_000_000, pace=1_000_000)
    assert (ended, received > 3_000_000) == ("eof", True)
    assert _cut(registry, "unsent_bytes") == _cut(registry, "write_timeout") == 0
