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

A choice's first event under ``echo`` (``EchoEvent``: its prompt with the prompt's logprobs,
about 290 KB for 500 tokens with ``logprobs: 20``) is not counted against ``max_bytes`` nor
``pause_bytes``: the request's validated fields bound it as they bound the non-streamed answer,
and it comes once per choice. Counted, two of them back to back passed ``max_bytes``
(``stream_not_read`` for an honest client at the default settings), and each one paused and
resumed the request (16 resumes of one 16-choice stream were seen: the default
``max_resumes``; one more would have cut it).

Memory per stream is at most ``max_bytes`` of counted events buffered (or one larger event
alone) and the request's echo events, each once, between the buffer and the piece the writer is
sending (the counted part of that piece at most ``max_bytes`` again), plus the transport's
high-water mark. All of it (``bounded``'s ``held``) counts toward the listener's
``max_unsent_response_bytes`` while the client does not keep up (``listeners/buffered.py``):
NOTE: only the slice in the transport did, so streams of echo events unread added up past it.

Backpressure (``Backpressure``): once ``pause_bytes`` wait untaken, the writer is stuck on its
client, and every further step the request ran would only add to what waits; its engine
request is paused (out of the running batch: its seat goes to other tenants, its KV blocks too
unless the engine keeps them, ``engine/sched/kept_kv.py``) until
the writer takes the buffer again, which it does only once its client has read. A client that
never reads again is cut off at the listener's write timeout, which ends the request. The
overflow abort stays as the bound for an engine that cannot pause, and for a ``pause_bytes`` at
or above ``max_bytes`` (then a stream is never paused). NOTE: the pause is advisory and taken
between steps, so what arrives after it (the step in flight, what the pumps hold) is put and
counted like the rest: ``pause_bytes`` must leave that much room below ``max_bytes`` (16.6-33.2
KB of the defaults' 192 KiB at 16 choices with 20 logprobs, ``test_paused_stream_bound.py``;
``ServeConfig`` refuses less than ``MIN_PAUSE_ROOM_BYTES``).
A resume whose KV was not kept
recomputes the request's prompt and output so far, so a client that keeps falling behind
(reading a byte at a time) could have the engine recompute again and again: past
``max_resumes`` resumes, a client that reads again gets what was buffered and the
``resumes_event`` instead, and the request ends.

Only a resume after a stall counts (``Backpressure.stall_s``): one whose pause saw a send of
the writer take ``stall_s`` or longer, the client taking nothing meanwhile. A client that reads
steadily but more slowly than the engine writes is paused and resumed again and again too (each
time ``pause_bytes`` gather while the writer waits on it), and counted, those resumes cut an
honest reader of a large stream. To see the client's progress the writer sends what it takes
in slices of at most ``SLICE_BYTES`` (a multi-MB piece, an echo event, is many sends), so a send
that lasts ``stall_s`` means the client took less than a slice in that time. With
``max_resumes`` 0 every resume counts: a paused stream is never resumed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from loraplex.clock import Clock, MonotonicClock

if TYPE_CHECKING:  # NOTE: imported, the listeners' package closed an import cycle (via deps)
    from loraplex.server.listeners.buffered import BufferedAnswers

# Resumes of one paused stream before it is cut off instead (``Backpressure.max_resumes``):
# enough for a reader that falls behind now and then, few enough that a stream costs at most
# this many recomputes of itself after stalls.
DEFAULT_MAX_STREAM_RESUMES = 16
# A send of the writer that lasts this long is a stall (the client stopped reading): only the
# resumes after one count against ``max_resumes``. Well above a slice's time at any pace an
# honest client reads (64 KiB in 2 s: 32 KiB/s), well below the listener's write timeout.
DEFAULT_STALL_S = 2.0
# The most the writer sends at once (the transport's high-water mark), so its sends measure
# the client's progress
SLICE_BYTES = 64 << 10
# The least room ``pause_bytes`` must leave below ``max_bytes`` where streams pause (``ServeConfig``
# refuses less). Nothing here bounds what arrives after a pause: the pause is a command the engine
# takes between steps, and the deltas it generated meanwhile (the step in flight, and every step
# the event loop had not read yet, merged per choice by ``outbox_stream``) still come, one event
# per running choice, each as large as its tokens and logprobs. Measured at most 33.2 KB (16
# chat choices with 20 ``top_logprobs`` on the engine process, ``test_paused_stream_bound.py``);
# a setting leaving less than twice that could cut a client that merely fell behind.
MIN_PAUSE_ROOM_BYTES = 64 << 10


@dataclass(frozen=True)
class Backpressure:
    """How a stream whose client stopped reading stops costing the engine."""

    pause_bytes: int  # untaken bytes from which the request is paused
    pause: Callable[[], Awaitable[None]]  # stop generating (idempotent, advisory)
    resume: Callable[[], Awaitable[None]]  # generate again
    max_resumes: int  # resumes after a stall allowed; at the next one the stream ends instead
    resumes_event: Callable[[int], str]  # that end's last event, given ``max_resumes``
    stall_s: float = DEFAULT_STALL_S  # a send this long is a stall (the client stopped reading)
    clock: Clock = field(default_factory=MonotonicClock)  # times the writer's sends


class _Flow:
    """Whether the request is paused now (the reader pauses it, the writer resumes it), and
    whether the client stalled while it was."""

    def __init__(self, backpressure: Backpressure | None) -> None:
        self.backpressure = backpressure
        self.paused = False
        self.stalled = False  # a send of the writer took ``stall_s`` during the current pause
        self.num_resumes = 0  # resumes after a stall

    async def after_put(self, num_bytes: int) -> None:
        bp = self.backpressure
        if bp is not None and not self.paused and num_bytes >= bp.pause_bytes:
            self.paused = True  # NOTE: before the await: the writer may resume meanwhile
            self.stalled = False
            await bp.pause()

    def after_send(self, send_s: float) -> None:
        """A send of the writer ended after ``send_s``."""
        bp = self.backpressure
        if bp is not None and self.paused and send_s >= bp.stall_s:
            self.stalled = True

    async def after_take(self) -> str | None:
        """Resumes a paused request; once it was resumed after a stall ``max_resumes`` times,
        leaves it paused and returns the stream's last event instead (the stream must end)."""
        bp = self.backpressure
        if bp is None or not self.paused:
            return None
        counted = self.stalled or bp.max_resumes == 0
        if counted and self.num_resumes >= bp.max_resumes:
            return bp.resumes_event(bp.max_resumes)
        self.paused = False
        self.num_resumes += counted
        await bp.resume()
        return None


class EchoEvent(str):
    """An event the read-ahead bound and the pause accounting do not count (module docstring):
    a choice's first event under ``echo``, whose size the request's validated fields bound."""

    __slots__ = ()


class _Buffer:
    """Events the writer has not taken yet (the reader appends, the writer takes all)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._parts: list[str] = []
        self._num_bytes = 0
        self.num_held = 0  # every byte waiting, an ``EchoEvent``'s too (``BufferedAnswers``)
        self._ended = False
        self._changed = asyncio.Event()

    @property
    def num_bytes(self) -> int:
        """Bytes waiting that count against ``max_bytes`` (an ``EchoEvent``'s do not)."""
        return self._num_bytes

    def put(self, text: str) -> bool:
        """Appends ``text``; False (nothing appended) when it would pass ``max_bytes`` behind
        counted events already waiting (one alone always fits: a client cannot read an event
        it was never sent). An ``EchoEvent`` always fits and counts nothing.
        NOTE: events are ASCII (``json.dumps`` escapes the rest), so characters are bytes."""
        num_counted = 0 if isinstance(text, EchoEvent) else len(text)
        if self._num_bytes and self._num_bytes + num_counted > self.max_bytes:
            return False
        self._parts.append(text)
        self._num_bytes += num_counted
        self.num_held += len(text)
        self._changed.set()
        return True

    def replace_all(self, text: str) -> None:
        """Drops everything buffered; ``text`` is all the writer gets from now on."""
        self._parts, self._num_bytes = [text], len(text)
        self.num_held = len(text)
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
        self._parts, self._num_bytes, self.num_held = [], 0, 0
        return text


async def _read_ahead(
    events: AsyncIterator[str],
    buffer: _Buffer,
    overflow_event: Callable[[int], str],
    abort: Callable[[], Awaitable[None]],
    flow: _Flow,
    *,
    held: BufferedAnswers | None,
) -> None:
    try:
        async for text in events:
            if not buffer.put(text):
                buffer.replace_all(overflow_event(buffer.max_bytes))
                return
            if held is not None:
                held.grew()
            await flow.after_put(buffer.num_bytes)
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
    backpressure: Backpressure | None = None,
    *,
    held: BufferedAnswers | None = None,
) -> AsyncIterator[str]:
    """``events`` as the writer takes them, read ahead into at most ``max_bytes`` (module
    docstring); past it, ``events`` is closed and ``overflow_event(max_bytes)`` is the last
    text. ``abort`` (idempotent) ends the request: it runs however this ends, even when the
    reader never started. With ``backpressure``, the request is paused while its writer is
    stuck and cut off past its resumes (module docstring). ``held`` (the connection's, from
    the listener) counts every byte buffered here and not yet sent, echo events included."""
    if backpressure is not None and backpressure.pause_bytes >= max_bytes:
        backpressure = None  # the overflow abort comes first: never paused
    buffer, flow = _Buffer(max_bytes), _Flow(backpressure)
    clock = backpressure.clock if backpressure is not None else MonotonicClock()
    unsent = [0]  # of the piece the writer is slicing
    with nullcontext() if held is None else held.source(lambda: buffer.num_held + unsent[0]):
        reader = asyncio.ensure_future(
            _read_ahead(events, buffer, overflow_event, abort, flow, held=held)
        )
        try:
            while (text := await buffer.take()) is not None:
                unsent[0] = len(text)
                last = await flow.after_take()
                if last is not None:  # resumed too often: cut off (the request is aborted below)
                    text += last
                for start in range(0, len(text), SLICE_BYTES):
                    # this slice is the transport's once yielded
                    unsent[0] = max(0, len(text) - start - SLICE_BYTES)
                    sent_at = clock.now()
                    yield text[start : start + SLICE_BYTES]
                    flow.after_send(clock.now() - sent_at)
                unsent[0] = 0
                if last is not None:
                    return
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
