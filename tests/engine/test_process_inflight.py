"""What the server has in flight in its engine child, at a hang verdict: the streams whose request
had no output yet fail with the hang's error (their ids returned, to abort in the child); a
stream with output, and every sibling of a request (``n`` > 1) one of whose streams had output,
keep waiting."""

from __future__ import annotations

import asyncio

from loraplex.engine.protocol import TokenDelta
from loraplex.engine.transport.messages import StepOut
from loraplex.engine.transport.process_inflight import InFlight
from loraplex.engine.transport.streams import Mailbox, Outbox
from loraplex.errors import EngineUnavailableError

_DELTA = TokenDelta((7,), "x", None, prompt_tokens=3, completion_tokens=1)


async def _drained(outboxes: dict[str, Outbox]) -> dict[str, list[object]]:
    await asyncio.sleep(0)  # the mailbox's flush runs on the loop
    await asyncio.sleep(0)
    got: dict[str, list[object]] = {}
    for rid, outbox in outboxes.items():
        got[rid] = []
        while not outbox.empty():
            got[rid].append(outbox.get_nowait())
    return got


def test_a_hang_fails_only_the_requests_without_output_siblings_counted_as_one() -> None:
    async def run() -> tuple[list[str], dict[str, list[object]], int]:
        inflight = InFlight()
        mailbox = Mailbox(asyncio.get_running_loop())
        groups = {"solo-out": "solo-out", "solo-none": "solo-none",  # rid -> its group
                  "n-0": "n-0", "n-1": "n-0", "m-0": "m-0", "m-1": "m-0"}  # fmt: skip
        outboxes: dict[str, Outbox] = {rid: asyncio.Queue() for rid in groups}
        for rid, group in groups.items():
            inflight.add_stream(rid, mailbox, outboxes[rid], group)
        # output for one solo request and for the second sibling of "n" only
        inflight.on_step_out(StepOut([("solo-out", _DELTA), ("n-1", _DELTA)]))
        error = EngineUnavailableError("the engine process is hung")
        failed = inflight.fail_unstarted(error)
        return failed, await _drained(outboxes), inflight.num_pending

    failed, got, pending = asyncio.run(run())
    assert sorted(failed) == ["m-0", "m-1", "solo-none"]
    for rid in failed:
        assert [type(item) for item in got[rid]] == [EngineUnavailableError]
    assert got["solo-out"] == [_DELTA] and got["n-1"] == [_DELTA] and got["n-0"] == []
    assert pending == 3  # the streaming ones still wait


def test_a_group_forgotten_with_its_last_stream_starts_unstarted_again() -> None:
    async def run() -> list[str]:
        inflight = InFlight()
        mailbox = Mailbox(asyncio.get_running_loop())
        first: Outbox = asyncio.Queue()
        inflight.add_stream("r", mailbox, first, "r")
        inflight.on_step_out(StepOut([("r", _DELTA)]))
        assert inflight.drop_stream("r", first)
        inflight.add_stream("r", mailbox, asyncio.Queue(), "r")  # the id reused later
        return inflight.fail_unstarted(EngineUnavailableError("hung"))

    assert asyncio.run(run()) == ["r"]
