"""A lean HTTP/1.1 client for the benchmark's streaming requests (stdlib asyncio only).

The benchmark's load generator shares the machine's cores with the server it measures. httpx
spent about 6 ms of CPU per streamed request here (connection pool, h11, decoders), as much as
the engine's own work per request: on 2 cores the load generator then slowed the system under
test. This client does only what the benchmark needs: one connection per request
(``Connection: close``), a JSON POST, the status line and headers, and the body's lines
(``Content-Length`` or chunked transfer encoding), which for SSE are the ``data:`` events.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit

_MAX_HEADER_BYTES = 64 << 10


class SseClientError(Exception):
    """The server's reply could not be read (closed early, malformed framing)."""


@dataclass(frozen=True)
class Reply:
    """A reply's status and headers (names lower-cased); the body is read separately."""

    status: int
    headers: dict[str, str]


class StreamingPost:
    """One POST on its own connection: ``async with`` opens it; ``reply`` and ``lines`` read it."""

    def __init__(self, base_url: str, path: str, body: object, headers: dict[str, str]) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"base_url {base_url!r} is invalid; expected http://host:port")
        self._host, self._port = parts.hostname, parts.port or 80
        self._path = path
        self._body = json.dumps(body, separators=(",", ":")).encode("utf-8")
        self._headers = headers
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self.reply: Reply | None = None

    async def __aenter__(self) -> StreamingPost:
        self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
        head = [
            f"POST {self._path} HTTP/1.1",
            f"Host: {self._host}:{self._port}",
            "Content-Type: application/json",
            f"Content-Length: {len(self._body)}",
            "Connection: close",
            *(f"{k}: {v}" for k, v in self._headers.items()),
        ]
        self._writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + self._body)
        await self._writer.drain()
        self.reply = await self._read_head()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()

    async def _read_head(self) -> Reply:
        assert self._reader is not None
        try:
            raw = await self._reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise SseClientError(f"no reply head ({type(exc).__name__})") from exc
        if len(raw) > _MAX_HEADER_BYTES:
            raise SseClientError("reply head too large")
        status_line, *lines = raw.decode("latin-1").split("\r\n")
        fields = status_line.split(" ", 2)
        if len(fields) < 2 or not fields[1].isdigit():
            raise SseClientError(f"malformed status line {status_line!r}")
        headers = {}
        for line in lines:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        return Reply(int(fields[1]), headers)

    async def body(self) -> bytes:
        """The whole body."""
        return b"".join([chunk async for chunk in self._chunks()])

    async def lines(self) -> AsyncIterator[str]:
        """The body's lines, as they arrive (without line endings)."""
        pending = b""
        async for chunk in self._chunks():
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for line in complete:
                yield line.rstrip(b"\r").decode("utf-8")
        if pending:
            yield pending.rstrip(b"\r").decode("utf-8")

    async def _chunks(self) -> AsyncIterator[bytes]:
        reader, reply = self._reader, self.reply
        assert reader is not None and reply is not None
        try:
            if reply.headers.get("transfer-encoding", "").lower() == "chunked":
                while True:
                    size_line = await reader.readuntil(b"\r\n")
                    size = int(size_line.split(b";", 1)[0].strip(), 16)
                    if size == 0:
                        return
                    data = await reader.readexactly(size + 2)
                    yield data[:-2]
            elif "content-length" in reply.headers:
                yield await reader.readexactly(int(reply.headers["content-length"]))
            else:
                while data := await reader.read(1 << 16):
                    yield data
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            raise SseClientError(f"reply body cut short or malformed ({exc})") from exc
