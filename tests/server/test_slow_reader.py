"""Through the real listener: a client that reads its stream steadily but more slowly than the
engine writes it is paused and resumed again and again (``server/stream_buffer.py``) and is never
cut for it: only resumes after a stall count against ``max_stream_resumes``. Before, every resume
counted, so an honest reader of a stream a few times larger than the buffers was cut with
``stream_resumed_too_often`` (a 16-choice demo stream read at 200 KB/s with
``max_stream_resumes`` 4 was cut after 2.4 MB).

The engine is a fake that writes at a steady pace far above the client's (the demo engine's pace
on a loaded machine is not) and, like the real engine, stops writing while paused: so the
stream is paused and resumed again and again, whatever the machine's load."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest
from conftest import Served, make_app_deps
from fakes import FakeEngine
from live import listening

from loraplex.engine.protocol import EngineRequest, TokenDelta
from loraplex.server.app import create_app
from loraplex.server.listeners import ConnectionLimits

READ_BYTES_PER_S = 100_000  # the client's steady pace
NUM_DELTAS = 300  # of WORD_CHARS each: about 0.35 MB of events, written in 0.3 s or more
WORD_CHARS = 1000
DELTA_INTERVAL_S = 0.001  # the engine's pace: up to 1 MB/s of text, 10 times the client's
MAX_RESUMES = 1
WAIT_S = 60.0


@dataclass
class PacedEngine(FakeEngine):
    """Writes ``NUM_DELTAS`` deltas of ``WORD_CHARS`` characters, one every
    ``DELTA_INTERVAL_S`` while not paused: the client falls behind, is paused and resumed."""

    flowing: asyncio.Event = field(default_factory=asyncio.Event)

    async def pause(self, request_id: str) -> None:
        await super().pause(request_id)
        self.flowing.clear()

    async def resume(self, request_id: str) -> None:
        await super().resume(request_id)
        self.flowing.set()

    async def _stream(self, request: EngineRequest) -> AsyncIterator[TokenDelta]:
        self.requests.append(request)
        self.flowing.set()
        num_prompt = len(request.prompt_token_ids)
        for count in range(1, NUM_DELTAS + 1):
            await self.flowing.wait()
            last = count == NUM_DELTAS
            yield TokenDelta((65,), "a" * WORD_CHARS, "length" if last else None, num_prompt, count)
            await asyncio.sleep(DELTA_INTERVAL_S)


@pytest.fixture
def engine_and_address(served: Served) -> Iterator[tuple[PacedEngine, tuple[str, int]]]:
    engine = PacedEngine()
    deps = make_app_deps(served, engine, max_stream_buffer_bytes=64 << 20,
                         stream_pause_bytes=16 << 10, max_stream_resumes=MAX_RESUMES)  # fmt: skip
    # small socket buffers, so the client falls behind after kilobytes, not megabytes
    with listening(create_app(deps), ConnectionLimits(send_buffer_bytes=16 << 10)) as (url, _):
        parts = urlsplit(url)
        yield engine, (parts.hostname or "", parts.port or 0)
    assert deps.cache is not None
    deps.cache.close()


def _read_steadily(sock: socket.socket, bytes_per_s: float) -> bytes:
    """Everything until the server closes, taken at ``bytes_per_s`` (16 KiB at a time)."""
    received, started = b"", time.monotonic()
    while chunk := sock.recv(16 << 10):
        received += chunk
        ahead_s = len(received) / bytes_per_s - (time.monotonic() - started)
        if ahead_s > 0:
            time.sleep(ahead_s)
    return received


def _body(response: bytes) -> bytes:
    """The chunked body's data, joined."""
    rest, data = response.split(b"\r\n\r\n", 1)[1], b""
    while rest:
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line, 16)
        data, rest = data + rest[:size], rest[size + 2 :]
    return data


def test_a_client_that_reads_steadily_is_never_cut_however_often_it_is_resumed(
    engine_and_address: tuple[PacedEngine, tuple[str, int]], served: Served
) -> None:
    engine, address = engine_and_address
    body = json.dumps({"model": "support", "prompt": "hi", "stream": True, "max_tokens": 1000})
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
        sock.settimeout(WAIT_S)
        sock.connect(address)
        sock.sendall(
            (
                "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                f"Authorization: Bearer {served.keys['acme']}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
            ).encode()
        )
        received = _read_steadily(sock, READ_BYTES_PER_S)
    assert b'"code":"stream_resumed_too_often"' not in received
    assert b"data: [DONE]" in received and b'"error"' not in received
    assert _body(received).count(b"a" * WORD_CHARS) == NUM_DELTAS  # every delta, whole
    # not vacuous: resumed more often than max_stream_resumes allows after stalls
    assert len(engine.resumed) > MAX_RESUMES, engine.resumed
