"""Streams whose client does not read (issue 25, item 4): the events are read ahead into a
bounded buffer (``server/stream_buffer.py``), a stream past it is aborted at once, and a
connection that takes nothing for ``write_timeout_s`` is cut off; either way the engine request
ends and its seats, KV blocks and adapter lease are freed. Before, generation ran to the end and
every delta waited in the request's engine queue until the client read (8 MB per response).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import suppress
from pathlib import Path

import httpx
import pytest
from stuck_client import (
    WAIT_S,
    long_stream,
    num_ended,
    open_not_reading,
    read_all,
    read_response,
    serving,
    wait_engine_freed,
    wait_until,
)

from loraplex.clock import ManualClock
from loraplex.demo.assets import DemoAssets
from loraplex.serve.config import ServeConfig
from loraplex.server.listeners import ConnectionLimits
from loraplex.server.stream_buffer import DEFAULT_STALL_S, Backpressure, bounded
from loraplex.server.streaming import not_read_event, resumed_too_often_event

# --- the buffer alone ------------------------------------------------------------------------


class Events:
    """``count`` events of ``size`` characters; records how far it was read and its close."""

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, size
        self.num_read = 0
        self.closed = False

    async def stream(self) -> AsyncIterator[str]:
        try:
            for index in range(self.count):
                self.num_read += 1
                yield f"{index % 10}" * self.size
                await asyncio.sleep(0)
        finally:
            self.closed = True


class Aborts:
    def __init__(self) -> None:
        self.num_calls = 0

    async def __call__(self) -> None:
        self.num_calls += 1


def test_a_reading_writer_gets_every_event_in_order() -> None:
    async def run() -> tuple[str, Events, Aborts]:
        events, aborts = Events(50, 10), Aborts()
        pieces = [p async for p in bounded(events.stream(), 1 << 20, not_read_event, aborts)]
        return "".join(pieces), events, aborts

    text, events, aborts = asyncio.run(run())
    assert text == "".join(f"{i % 10}" * 10 for i in range(50))
    assert events.closed and aborts.num_calls >= 1


def test_a_writer_that_stops_taking_aborts_the_stream_past_the_bound() -> None:
    async def run() -> tuple[list[str], Events, Aborts]:
        events, aborts = Events(10_000, 100), Aborts()
        stream = bounded(events.stream(), 1000, not_read_event, aborts)
        pieces = [await anext(stream)]  # then the writer is stuck on its client
        for _ in range(200):
            await asyncio.sleep(0)
        stuck_at = events.num_read
        assert events.closed and aborts.num_calls == 1  # aborted without the writer
        pieces += [piece async for piece in stream]  # the client reads again
        assert events.num_read == stuck_at
        return pieces, events, aborts

    pieces, events, _ = asyncio.run(run())
    assert events.num_read <= 12  # the first, ten in the buffer, the one that did not fit
    assert pieces[-1] == not_read_event(1000)
    assert json.loads(pieces[-1][len("data: ") :])["error"]["code"] == "stream_not_read"


def test_one_event_larger_than_the_bound_still_passes() -> None:
    async def run() -> tuple[str, Aborts]:
        events, aborts = Events(3, 5000), Aborts()  # e.g. an echoed prompt with its logprobs
        pieces = [p async for p in bounded(events.stream(), 1000, not_read_event, aborts)]
        return "".join(pieces), aborts

    text, _ = asyncio.run(run())
    assert text == "0" * 5000 + "1" * 5000 + "2" * 5000


def test_closing_the_writer_closes_the_events_and_aborts() -> None:
    async def run() -> tuple[Events, Aborts]:
        events, aborts = Events(10_000, 10), Aborts()
        stream = bounded(events.stream(), 1 << 20, not_read_event, aborts)
        await anext(stream)
        await stream.aclose()
        return events, aborts

    events, aborts = asyncio.run(run())
    assert events.closed and aborts.num_calls >= 1 and events.num_read < 10_000


class Flow:
    """Records pauses and resumes, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def pause(self) -> None:
        self.calls.append("pause")

    async def resume(self) -> None:
        self.calls.append("resume")


def test_a_stuck_writer_pauses_the_request_and_a_reading_one_resumes_it() -> None:
    async def run() -> tuple[list[str], Events, Aborts, Flow]:
        events, aborts, flow = Events(40, 100), Aborts(), Flow()
        backpressure = Backpressure(500, flow.pause, flow.resume, 16, resumed_too_often_event)
        stream = bounded(events.stream(), 1 << 20, not_read_event, aborts, backpressure)
        pieces = [await anext(stream)]  # then the writer is stuck on its client
        for _ in range(200):
            await asyncio.sleep(0)
        assert flow.calls == ["pause"]  # once, however much more the (fake) source sends
        pieces += [piece async for piece in stream]  # the client reads again
        return pieces, events, aborts, flow

    pieces, _, _, flow = asyncio.run(run())
    assert "".join(pieces) == "".join(f"{i % 10}" * 100 for i in range(40))  # nothing lost
    assert flow.calls[:2] == ["pause", "resume"]
    assert flow.calls.count("pause") == flow.calls.count("resume")  # never left paused


def test_a_pause_bound_at_or_above_the_buffer_never_pauses() -> None:
    async def run() -> tuple[Aborts, Flow]:
        events, aborts, flow = Events(10_000, 100), Aborts(), Flow()
        backpressure = Backpressure(1000, flow.pause, flow.resume, 16, resumed_too_often_event)
        stream = bounded(events.stream(), 1000, not_read_event, aborts, backpressure)
        await anext(stream)
        for _ in range(200):
            await asyncio.sleep(0)
        await stream.aclose()
        return aborts, flow

    aborts, flow = asyncio.run(run())
    assert flow.calls == [] and aborts.num_calls >= 1  # the overflow abort, as without it


# --- a real server and engine ----------------------------------------------------------------


NUM_CHOICES = 16  # with max_num_seqs 2, far more generation than the limits below allow


@pytest.mark.parametrize("engine_process", [False, True], ids=["thread", "process"])
def test_a_client_that_does_not_read_is_cut_off_at_the_write_timeout(
    demo_assets: DemoAssets, tmp_path: Path, engine_process: bool
) -> None:
    limits = ConnectionLimits(write_timeout_s=1.0)
    config = {"engine_process": engine_process, "max_num_seqs": 2,
              "max_stream_buffer_bytes": 64 << 20}  # fmt: skip
    with serving(demo_assets, tmp_path, limits, **config) as (server, address, listener):
        with open_not_reading(address, listener, server, long_stream(NUM_CHOICES)) as sock:
            wait_engine_freed(server, NUM_CHOICES)
            received = read_all(sock)  # the connection was cut: its end comes at once
        assert received.startswith(b"HTTP/1.1 200")
        assert not received.endswith(b"0\r\n\r\n")  # cut, not complete
        assert listener.server_state.connections == set() or all(
            p.client is None or p.client[1] != sock.getsockname()[1]
            for p in listener.server_state.connections
        )


def test_a_stream_past_its_buffer_is_aborted_and_says_why(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    limits = ConnectionLimits(write_timeout_s=600.0)
    config = {"engine_process": False, "max_num_seqs": 2, "max_stream_buffer_bytes": 16 << 10,
              "stream_pause_bytes": 1 << 30}  # fmt: skip  # never paused: the abort path
    with (
        serving(demo_assets, tmp_path, limits, **config) as (server, address, listener),
        open_not_reading(address, listener, server, long_stream(NUM_CHOICES)) as sock,
    ):
        wait_engine_freed(server, NUM_CHOICES)  # with the client still not reading
        received = read_all(sock)  # now it reads: the stream ends, and says why
    assert b'"code":"stream_not_read"' in received
    assert received.endswith(b"0\r\n\r\n")
    assert b"data: [DONE]" not in received


@pytest.mark.parametrize("engine_process", [False, True], ids=["thread", "process"])
def test_a_client_that_does_not_read_is_paused_and_another_tenant_is_served(
    demo_assets: DemoAssets, tmp_path: Path, engine_process: bool
) -> None:
    """Its siblings stop being scheduled (no request running; KV blocks held only by those kept
    for their resume, within ``max_paused_kv_fraction``) and stop pinning their adapter's GPU
    slot while the stream stays open and unaborted; another
    tenant's request on another adapter then takes that one slot and completes. With no
    resume allowed (``max_stream_resumes`` 0), the client reading again gets what was buffered
    and an error event, and the request is aborted, its kept KV blocks freed."""
    limits = ConnectionLimits(write_timeout_s=600.0)
    config = {"engine_process": engine_process, "max_num_seqs": 2, "max_loras": 1,
              "max_stream_buffer_bytes": 64 << 20, "stream_pause_bytes": 8 << 10,
              "max_stream_resumes": 0}  # fmt: skip
    with (
        serving(demo_assets, tmp_path, limits, **config) as (server, address, listener),
        open_not_reading(address, listener, server, long_stream(NUM_CHOICES)) as sock,
    ):
        load = wait_until(  # every unfinished sibling paused: none queued, none running
            server, lambda load: load.num_paused > 0 and load.num_running == load.num_waiting == 0,
            "paused",
        )  # fmt: skip
        # KV blocks held only by the siblings that were running when paused and kept theirs
        assert load.kv_usage <= 0.25 and (load.kv_usage > 0) == (load.num_pauses_kv_kept > 0)
        assert num_ended(server, "abort") == 0  # paused, not aborted
        host, port = address
        reply = httpx.post(
            f"http://{host}:{port}/v1/completions",
            # ignore_eos: a sampled EOS at token 2 once made it 2 == 4 (fresh-clone CI)
            json={"model": "search", "prompt": "hello", "max_tokens": 4, "ignore_eos": True},
            headers={"Authorization": f"Bearer {server.sample_keys['globex']}"},
            timeout=WAIT_S,
        )
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4
        # NOTE: an engine process publishes its counts every few ms: the victim's end may show late
        after = wait_until(server, lambda load: load.num_running == 0, "done running")
        assert after.num_paused == load.num_paused, after  # the stuck stream still paused
        received = read_response(sock)  # it reads again: no resume left
        # the engine takes the aborts in its next turn
        ended = wait_until(server, lambda load: load.num_paused == 0, "unpaused")
        assert ended.kv_usage == 0  # aborted: nothing left of it
        assert num_ended(server, "abort") >= 1
    assert received.endswith(b"0\r\n\r\n") and b"data: [DONE]" not in received
    assert b'"code":"stream_resumed_too_often"' in received


def test_a_paused_stream_whose_slot_was_taken_completes_once_its_client_reads(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    """Resumed, a paused request asks for its adapter's lease again (the one slot went to
    another tenant's adapter meanwhile) and its stream completes: nothing lost."""
    limits = ConnectionLimits(write_timeout_s=600.0)
    config = {"engine_process": False, "max_num_seqs": 2, "max_loras": 1,
              "max_stream_buffer_bytes": 64 << 20, "stream_pause_bytes": 8 << 10}  # fmt: skip
    with (
        serving(demo_assets, tmp_path, limits, **config) as (server, address, listener),
        open_not_reading(address, listener, server, long_stream(1)) as sock,
    ):
        paused = wait_until(server, lambda load: load.num_paused > 0, "paused")
        assert paused.num_paused == 1
        host, port = address
        reply = httpx.post(
            f"http://{host}:{port}/v1/completions",
            # ignore_eos: a sampled EOS at token 2 once made it 2 == 4 (fresh-clone CI)
            json={"model": "search", "prompt": "hello", "max_tokens": 4, "ignore_eos": True},
            headers={"Authorization": f"Bearer {server.sample_keys['globex']}"},
            timeout=WAIT_S,
        )
        assert reply.status_code == 200
        received = read_response(sock)  # now it reads
        load = server.engine.load_snapshot()
    assert b"data: [DONE]" in received
    assert b'"finish_reason":"length"' in received and b'"error"' not in received
    assert load.num_resumes >= 1 and load.num_pauses >= load.num_resumes
    assert num_ended(server, "abort") == 0


def test_a_stream_resumed_too_often_is_cut_off_and_says_why() -> None:
    """Each resume recomputes the request: a client that keeps falling behind (reading a byte
    at a time) is resumed ``max_resumes`` times; falling behind once more ends its stream with
    an error event after what was buffered, and aborts the request."""

    async def run() -> tuple[list[str], Events, Aborts, Flow]:
        events, aborts, flow, clock = Events(10_000, 100), Aborts(), Flow(), ManualClock()
        backpressure = Backpressure(500, flow.pause, flow.resume, 2, resumed_too_often_event,
                                    clock=clock)  # fmt: skip
        stream = bounded(events.stream(), 1 << 20, not_read_event, aborts, backpressure)
        pieces = [await anext(stream)]
        for _ in range(4):  # stuck (paused) for a stall, then the client reads what waits
            for _ in range(50):
                await asyncio.sleep(0)
            clock.advance(DEFAULT_STALL_S)
            pieces += [piece async for piece in _one(stream)]
        return pieces, events, aborts, flow

    pieces, events, aborts, flow = asyncio.run(run())
    assert flow.calls == ["pause", "resume", "pause", "resume", "pause"]  # no third resume
    assert pieces[-1].endswith(resumed_too_often_event(2)) and len(pieces) == 4  # then it ended
    text = "".join(pieces)[: -len(resumed_too_often_event(2))]
    assert text == "".join(f"{i % 10}" * 100 for i in range(len(text) // 100))  # nothing lost
    assert events.closed and aborts.num_calls >= 1
    error = json.loads(resumed_too_often_event(2)[len("data: ") :])["error"]
    assert error["code"] == "stream_resumed_too_often" and "max_stream_resumes" in error["message"]


async def _one(stream: AsyncIterator[str]) -> AsyncIterator[str]:
    """The next piece of ``stream``, if there is one."""
    with suppress(StopAsyncIteration):
        yield await anext(stream)


@pytest.mark.parametrize("name", ["write_timeout_s", "max_stream_buffer_bytes"])
def test_stream_limits_are_checked(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match=f"{name} 0 is invalid"):
        ServeConfig(data_dir=tmp_path, **{name: 0})  # type: ignore[arg-type]


def test_max_stream_resumes_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^max_stream_resumes -1 is invalid; expected >= 0$"):
        ServeConfig(data_dir=tmp_path, max_stream_resumes=-1)
