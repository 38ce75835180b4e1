"""``outbox_stream``: what an engine client yields from a request's outbox."""

from __future__ import annotations

import asyncio

import pytest

from loraplex.engine.protocol import TokenDelta
from loraplex.engine.transport.streams import Outbox, outbox_stream
from loraplex.errors import QueueTimeoutError


def _delta(token: int, done: str | None = None) -> TokenDelta:
    return TokenDelta((token,), f"<{token}>", done, prompt_tokens=3, completion_tokens=token)


def test_deltas_that_queued_up_come_out_merged_in_order() -> None:
    async def run() -> tuple[list[TokenDelta], list[bool]]:
        outbox: Outbox = asyncio.Queue()
        stops: list[bool] = []
        stream = outbox_stream(outbox, lambda: None, stops.append)
        outbox.put_nowait(_delta(1))
        first = await anext(stream)  # consumed at once: nothing to merge yet
        for token in (2, 3, 4):
            outbox.put_nowait(_delta(token))
        outbox.put_nowait(_delta(5, "length"))
        outbox.put_nowait(_delta(99))  # never read: the request finished before it
        return [first] + [d async for d in stream], stops

    deltas, stops = asyncio.run(run())
    assert [d.token_ids for d in deltas] == [(1,), (2, 3, 4, 5)]
    assert deltas[1].text == "<2><3><4><5>"
    assert (deltas[1].finish_reason, deltas[1].completion_tokens) == ("length", 5)
    assert stops == [True]


def test_an_error_after_queued_deltas_follows_them() -> None:
    async def run() -> tuple[list[TokenDelta], list[bool]]:
        outbox: Outbox = asyncio.Queue()
        stops: list[bool] = []
        stream = outbox_stream(outbox, lambda: None, stops.append)
        outbox.put_nowait(_delta(1))
        outbox.put_nowait(_delta(2))
        outbox.put_nowait(QueueTimeoutError("r", 1.0, 2.0))
        got = [await anext(stream)]
        with pytest.raises(QueueTimeoutError):
            await anext(stream)
        return got, stops

    got, stops = asyncio.run(run())
    assert [d.token_ids for d in got] == [(1, 2)]
    assert stops == [True]  # ended by the engine: nothing to abort


def test_a_consumer_that_leaves_early_gets_its_request_aborted() -> None:
    async def run() -> list[bool]:
        outbox: Outbox = asyncio.Queue()
        started: list[bool] = []
        stops: list[bool] = []
        stream = outbox_stream(outbox, lambda: started.append(True), stops.append)
        assert not started  # nothing is submitted before the first iteration
        outbox.put_nowait(_delta(1))
        await anext(stream)
        await stream.aclose()
        assert started == [True]
        return stops

    assert asyncio.run(run()) == [False]
