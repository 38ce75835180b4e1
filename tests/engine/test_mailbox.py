"""The engine thread hands a step's deltas to an event loop with one wakeup."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from loraplex.engine.protocol import TokenDelta
from loraplex.engine.transport.streams import Mailbox, Outbox


def _delta(n: int) -> TokenDelta:
    return TokenDelta((n,), str(n), None, 1, n)


def test_a_batch_of_posts_costs_one_wakeup_and_keeps_order() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        calls: list[Any] = []
        original = loop.call_soon_threadsafe

        def counting(callback: Any, *args: Any) -> Any:
            calls.append(callback)
            return original(callback, *args)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign, assignment]
        mailbox = Mailbox(loop)
        first: Outbox = asyncio.Queue()
        second: Outbox = asyncio.Queue()

        def engine_step() -> None:  # what the engine thread does in one step
            for n in range(3):
                mailbox.post(first, _delta(n))
                mailbox.post(second, _delta(10 + n))
            mailbox.wake()
            mailbox.wake()  # nothing new: no second wakeup

        thread = threading.Thread(target=engine_step)
        thread.start()
        got = [await asyncio.wait_for(first.get(), 5) for _ in range(3)]
        thread.join()
        assert [d.completion_tokens for d in got if isinstance(d, TokenDelta)] == [0, 1, 2]
        assert second.qsize() == 3 and len(calls) == 1
        mailbox.post(first, _delta(3))
        mailbox.wake()  # after a flush, the next batch wakes the loop again
        assert isinstance(await asyncio.wait_for(first.get(), 5), TokenDelta)
        assert len(calls) == 2

    asyncio.run(scenario())


def test_wake_without_posts_does_nothing_and_a_closed_loop_drops_items() -> None:
    loop = asyncio.new_event_loop()
    mailbox = Mailbox(loop)
    mailbox.wake()  # nothing pending: must not touch the loop
    loop.close()
    outbox: Outbox = asyncio.Queue()
    mailbox.post(outbox, _delta(1))
    mailbox.wake()  # the loop is gone: no error, items dropped
    mailbox.wake()
    assert outbox.qsize() == 0
