"""Client disconnects abort the engine request (non-streaming and streaming paths)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from conftest import Served, make_app_deps
from fakes import FakeEngine
from starlette.requests import Request

from loraplex.engine.protocol import EngineRequest
from loraplex.sampling import SamplingParams
from loraplex.server.protocol import RevisionInfo
from loraplex.server.serving import ClientDisconnectedError, collect, first_delta, start_stream
from loraplex.server.streaming import ChunkFormat, sse_events


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


def test_non_streaming_disconnect_aborts(served: Served) -> None:
    async def scenario() -> None:
        engine = FakeEngine(gate=asyncio.Event())
        deps = make_app_deps(served, engine)
        stub = StubRequest()
        task = asyncio.ensure_future(
            collect(cast(Request, stub), engine.generate(_request("r-1")), deps, "r-1")
        )
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
        deps = make_app_deps(served, engine)
        collected = await collect(
            cast(Request, StubRequest()), engine.generate(_request("r-2")), deps, "r-2"
        )
        assert collected is not None and collected.text == " base answers."
        assert collected.finish_reason == "stop" and engine.aborted == []

    asyncio.run(scenario())


def test_streaming_cancel_aborts(served: Served) -> None:
    async def scenario() -> None:
        engine = FakeEngine(gate=asyncio.Event())
        deps = make_app_deps(served, engine)
        stream = engine.generate(_request("r-3"))
        first = await first_delta(stream, deps, "r-3")
        fmt = ChunkFormat("r-3", 0, "m", RevisionInfo(revision=None, adapter_digest=None), False)
        events = sse_events(first, stream, fmt, False, deps)

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
        deps = make_app_deps(served, engine)
        never = asyncio.Event()

        async def queued() -> Any:
            await never.wait()  # an adapter that never finishes loading
            yield None

        stub = StubRequest()
        task = asyncio.ensure_future(start_stream(cast(Request, stub), queued(), deps, "r-4"))
        await asyncio.sleep(0.01)
        stub.leave()
        with pytest.raises(ClientDisconnectedError):
            await asyncio.wait_for(task, 5)
        assert engine.aborted == ["r-4"]

    asyncio.run(scenario())
