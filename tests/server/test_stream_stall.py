"""Only a stall counts against ``max_stream_resumes`` (``server/stream_buffer.py``): a client
that reads steadily but more slowly than the engine writes is paused and resumed again and
again, and is never cut for it, even behind a piece of several slices (an echo event); a client
that stalls is cut once it was resumed ``max_resumes`` times (``test_stuck_stream.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from loraplex.clock import ManualClock
from loraplex.server.stream_buffer import (
    DEFAULT_STALL_S,
    SLICE_BYTES,
    Backpressure,
    EchoEvent,
    bounded,
)
from loraplex.server.streaming import not_read_event, resumed_too_often_event

READ_BYTES_PER_S = SLICE_BYTES  # the client's pace: a slice a second, below the stall bound
NUM_EVENTS = 300
EVENT_BYTES = 100
ECHO_BYTES = 3 * SLICE_BYTES  # one send of it would last 3 s: a stall


async def _events(log: list[str]) -> AsyncIterator[str]:
    """An echo event of three slices, then ``NUM_EVENTS`` ordinary ones (logged as sent)."""
    log.append("e" * ECHO_BYTES)
    yield EchoEvent(log[-1])
    for index in range(NUM_EVENTS):
        log.append(f"{index % 10}" * EVENT_BYTES)
        yield log[-1]
        await asyncio.sleep(0)


class Flow:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def pause(self) -> None:
        self.calls.append("pause")

    async def resume(self) -> None:
        self.calls.append("resume")


async def _noop() -> None:
    return None


def test_a_client_that_reads_steadily_is_resumed_past_max_resumes_and_never_cut() -> None:
    async def run() -> tuple[list[str], list[str], Flow]:
        log: list[str] = []
        flow, clock = Flow(), ManualClock()
        backpressure = Backpressure(
            500, flow.pause, flow.resume, 1, resumed_too_often_event, clock=clock
        )
        pieces = []
        async for piece in bounded(_events(log), 1 << 20, not_read_event, _noop, backpressure):
            pieces.append(piece)
            for _ in range(20):  # the engine writes ahead while the client reads this piece
                await asyncio.sleep(0)
            clock.advance(len(piece) / READ_BYTES_PER_S)
        return pieces, log, flow

    pieces, log, flow = asyncio.run(run())
    assert "".join(pieces) == "".join(log)  # nothing lost, no error event
    assert len(log) == NUM_EVENTS + 1
    assert max(len(piece) for piece in pieces) <= SLICE_BYTES
    assert flow.calls.count("resume") > 3  # not vacuous: far past max_resumes 1
    assert flow.calls.count("pause") == flow.calls.count("resume")


def test_a_stall_while_paused_counts_and_cuts_the_stream_past_max_resumes() -> None:
    """The same client, but two of its sends, each while the request is paused, last
    ``DEFAULT_STALL_S``: the first is resumed (``max_resumes`` 1), the second ends the stream
    with the error event."""

    async def run() -> tuple[list[str], Flow]:
        log: list[str] = []
        flow, clock = Flow(), ManualClock()
        backpressure = Backpressure(
            500, flow.pause, flow.resume, 1, resumed_too_often_event, clock=clock
        )
        stream = bounded(_events(log), 1 << 20, not_read_event, _noop, backpressure)
        pieces, stalled_in = [], 0  # the pause (by count) of the latest stall
        async for piece in stream:
            pieces.append(piece)
            for _ in range(20):
                await asyncio.sleep(0)
            num_pauses = flow.calls.count("pause")
            # stuck once in each of the first two pauses, while paused
            stalled = flow.calls[-1:] == ["pause"] and stalled_in < num_pauses <= 2
            stalled_in = num_pauses if stalled else stalled_in
            clock.advance(DEFAULT_STALL_S if stalled else len(piece) / READ_BYTES_PER_S)
        return pieces, flow

    pieces, flow = asyncio.run(run())
    assert pieces[-1].endswith(resumed_too_often_event(1))
    assert flow.calls[-3:] == ["pause", "resume", "pause"]  # the second stall: not resumed
