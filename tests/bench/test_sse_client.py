"""The benchmark's lean HTTP client against a raw socket server: chunked and sized bodies,
lines split across chunks, and a reply cut short."""

from __future__ import annotations

import asyncio
import json

import pytest

from loraplex.bench.sse_client import SseClientError, StreamingPost


async def _serve(reply: bytes, seen: list[bytes]) -> tuple[asyncio.Server, str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))  # fmt: skip
        seen.append(head + await reader.readexactly(length))
        writer.write(reply)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


def _run(reply: bytes) -> tuple[int, dict[str, str], list[str], bytes]:
    async def main() -> tuple[int, dict[str, str], list[str], bytes]:
        seen: list[bytes] = []
        server, url = await _serve(reply, seen)
        headers = {"Authorization": "Bearer k"}
        async with server, StreamingPost(url, "/v1/x", {"a": 1}, headers) as post:
            assert post.reply is not None
            lines = [line async for line in post.lines()]
            return post.reply.status, post.reply.headers, lines, seen[0]

    return asyncio.run(main())


def test_chunked_sse_lines_split_across_chunks() -> None:
    events = b'data: {"n": 1}\n\ndata: {"n"' + b": 2}\n\ndata: [DONE]\n\n"
    first, second = events[:20], events[20:]
    body = b"%x\r\n%s\r\n%x;ext=1\r\n%s\r\n0\r\n\r\n" % (len(first), first, len(second), second)
    reply = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Loraplex-Tier: L1\r\n\r\n" + body
    status, headers, lines, request = _run(reply)
    assert status == 200 and headers["x-loraplex-tier"] == "L1"
    assert [line for line in lines if line] == ['data: {"n": 1}', 'data: {"n": 2}', "data: [DONE]"]
    head, _, sent = request.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/x HTTP/1.1") and b"Authorization: Bearer k" in head
    assert json.loads(sent) == {"a": 1}


def test_sized_error_body() -> None:
    payload = b'{"error": {"type": "not_found"}}'
    reply = b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload)
    status, _, lines, _ = _run(reply)
    assert status == 404 and lines == [payload.decode()]


def test_a_reply_cut_short_is_an_error() -> None:
    reply = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nshort"
    with pytest.raises(SseClientError, match="cut short"):
        _run(reply)
    with pytest.raises(SseClientError, match="no reply head"):
        _run(b"HTTP/1.1 200 OK\r\n")
