"""A stream's events read ahead of its writer into a bounded buffer.

A client that stops reading a stream stops uvicorn's writer: the transport holds its high-water
mark of unsent bytes (64 KiB) and every further ``send`` waits. Before this buffer the wait also
stopped the reading of the engine's deltas, which then queued up in the request's engine outbox,
one per step, for as long as the engine went on generating (8 MB per response was seen). Here a
reader task takes every delta as it comes, formats it and appends the event to a buffer of at
most ``max_bytes``; the writer sends what has gathered in one piece. Past ``max_bytes`` the
request is aborted at once (its seat, KV blocks and adapter lease freed), the buffered events are
dropped and one error event takes their place, so a client that reads again learns why its
stream ended; the listener's write timeout then closes a connection that still takes nothing.

Memory per stream is at most ``max_bytes`` buffered (or one larger event alone), plus the piece
the writer is sending (as much again), plus the transport's high-water mark.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio


class _Buffer:
    """Events the writer has not taken yet (the reader appends, the writer takes all)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._parts: list[str] = []
        self._num_bytes = 0
        self._ended = False
        self._changed = asyncio.Event()

    def put(self, text: str) -> bool:
        """Appends ``text``; False (nothing appended) when it would pass ``max_bytes`` behind
        events already waiting (one event alone always fits: an ``echo`` of a long prompt with
        its logprobs is one large event, made whether or not it is buffered).
        NOTE: events are ASCII (``json.dumps`` escapes the rest), so characters are bytes."""
        if self._parts and self._num_bytes + len(text) > self.max_bytes:
            return False
        self._parts.append(text)
        self._num_bytes += len(text)
        self._changed.set()
        return True

    def replace_all(self, text: str) -> None:
        """Drops everything buffered; ``text`` is all the writer gets from now on."""
        self._parts, self._num_bytes = [text], len(text)
        self._changed.set()

    def end(self) -> None:
        self._ended = True
        self._changed.set()

    async def take(self) -> str | None:
        """Everything buffered, joined, once there is any; None once ended and empty."""
        while not self._parts:
            if self._ended:
                return None
            self._changed.clear()
            await self._changed.wait()
        text = "".join(self._parts)
        self._parts, self._num_bytes = [], 0
        return text


async def _read_ahead(
    events: AsyncIterator[str],
    buffer: _Buffer,
    overflow_event: Callable[[int], str],
    abort: Callable[[], Awaitable[None]],
) -> None:
    try:
        async for text in events:
            if not buffer.put(text):
                buffer.replace_all(overflow_event(buffer.max_bytes))
                return
    finally:
        buffer.end()
        with anyio.CancelScope(shield=True):
            await _aclose(events)
            await abort()  # at once: the writer may wait on its client for long


async def bounded(
    events: AsyncIterator[str],
    max_bytes: int,
    overflow_event: Callable[[int], str],
    abort: Callable[[], Awaitable[None]],
) -> AsyncIterator[str]:
    """``events`` as the writer takes them, read ahead into at most ``max_bytes`` (module
    docstring); past it, ``events`` is closed and ``overflow_event(max_bytes)`` is the last
    text. ``abort`` (idempotent) ends the request: it runs however this ends, even when the
    reader never started."""
    buffer = _Buffer(max_bytes)
    reader = asyncio.ensure_future(_read_ahead(events, buffer, overflow_event, abort))
    try:
        while (text := await buffer.take()) is not None:
            yield text
        await reader  # what ended the reader, if it failed: a cut stream is never silent
    finally:
        reader.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.wait({reader})
            await _aclose(events)
            await abort()


async def _aclose(stream: AsyncIterator[str]) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()
