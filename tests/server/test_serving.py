"""Client disconnects abort the engine request (non-streaming and streaming paths)."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any, cast

import pytest
from conftest import Served, make_app_deps
from fakes import FakeEngine
from starlette.requests import Request

from loraplex.engine.protocol import EngineRequest
from loraplex.sampling import SamplingParams
from loraplex.server.choices import Fanout, Sibling
from loraplex.server.disconnect import ClientDisconnectedError, collect, first_item, start_stream
from loraplex.server.logprobs_format import TokenStrings
from loraplex.server.protocol import RevisionInfo
from loraplex.server.streaming import ChunkFormat, StreamChoices, sse_events


class StubRequest:
    """Receives nothing until ``leave()``, then a disconnect (what uvicorn does)."""

    def __init__(self) -> None:
        self.left = asyncio.Event()

    def leave(self) -> None:
        self.left.set()

    async def receive(self) -> dict[str, Any]:
        await self.left.wait()
        return {"type": "http.disconnect"}


def _request(request_id: str) -> EngineRequest:
    return EngineRequest(request_id, "acme", None, (1, 2), SamplingParams(max_tokens=8))


def _one(engine: FakeEngine, request_id: str, stream: Any = None) -> Fanout:
    stream = engine.generate(_request(request_id)) if stream is None else stream
    return Fanout(engine, [Sibling(request_id, 0, stream)])


def test_non_streaming_disconnect_aborts(served: Served) -> None:
    async def scenario() -> None:
        engine = FakeEngine(gate=asyncio.Event())
        make_app_deps(served, engine)
        stub = StubRequest()
        task = asyncio.ensure_future(collect(cast(Request, stub), _one(engine, "r-1"), 1))
        await asyncio.sleep(0.01)
        assert not task.done() and engine.aborted == []
        stub.leave()
        with pytest.raises(ClientDisconnectedError):
            await asyncio.wait_for(task, 5)
        assert engine.aborted == ["r-1"]

    asyncio.run(scenario())


def test_non_streaming_completes_without_abort(served: Served) -> None:
    async def scenario() -> None:
        engine = FakeEngine()
        make_app_deps(served, engine)
        (collected,) = await collect(cast(Request, StubRequest()), _one(engine, "r-2"), 1)
        assert collected.text == " base answers."
        assert collected.finish_reason == "stop" and engine.aborted == []

    asyncio.run(scenario())


def test_streaming_cancel_aborts(served: Served) -> None:
    async def scenario() -> None:
        engine = FakeEngine(gate=asyncio.Event())
        deps = make_app_deps(served, engine)
        fanout = _one(engine, "r-3")
        first = await first_item(fanout)
        fmt = ChunkFormat("r-3", 0, "m", RevisionInfo(revision=None, adapter_digest=None), False)
        choices = StreamChoices(fmt, 1, None, TokenStrings(deps.engine.tokenizer))
        events = sse_events(
            first, fanout, choices, 1, False, place=partial(deps.jobs.place, "acme")
        )

        async def consume() -> list[str]:
            return [chunk async for chunk in events]

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.01)
        task.cancel()  # what Starlette does when the client disconnects
        await asyncio.gather(task, return_exceptions=True)
        assert engine.aborted == ["r-3"]

    asyncio.run(scenario())


def test_disconnect_while_queued_aborts_before_any_token(served: Served) -> None:
    async def scenario() -> None:
        engine = FakeEngine()
        make_app_deps(served, engine)
        never = asyncio.Event()

        async def queued() -> Any:
            await never.wait()  # an adapter that never finishes loading
            yield None

        stub = StubRequest()
        task = asyncio.ensure_future(
            start_stream(cast(Request, stub), _one(engine, "r-4", queued()))
        )
        await asyncio.sleep(0.01)
        stub.leave()
        with pytest.raises(ClientDisconnectedError):
            await asyncio.wait_for(task, 5)
        assert engine.aborted == ["r-4"]

    asyncio.run(scenario())


def _metrics() -> Any:
    from loraplex.clock import ManualClock
    from loraplex.release.traffic import ReleaseTraffic
    from loraplex.server.metrics import ServerMetrics
    from loraplex.server.recent_requests import RecentRequests

    clock = ManualClock()
    return ServerMetrics(FakeEngine(), None, releases=ReleaseTraffic(clock, tuple),
                         recent=RecentRequests(clock), model_name="base")  # fmt: skip


def _outcomes(metrics: Any) -> dict[str, float]:
    return {
        sample.labels["outcome"]: sample.value
        for family in metrics.requests.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def test_a_stream_closed_before_its_first_read_still_records_its_outcome() -> None:
    """A sibling whose pump task was cancelled before it ran (its request aborted at once) is
    closed without ever being read: it was counted as arrived, so it must count as ended
    (the async generator this replaced never ran its ``finally`` then)."""
    from loraplex.server.observed import Observed

    async def never_read() -> Any:
        yield None  # pragma: no cover - never reached

    async def run() -> dict[str, float]:
        metrics = _metrics()
        stream = Observed(never_read(), metrics.start_request("normal", False, 0.0))
        await stream.aclose()
        await stream.aclose()  # idempotent: counted once
        return _outcomes(metrics)

    assert asyncio.run(run()) == {"abort": 1.0}
