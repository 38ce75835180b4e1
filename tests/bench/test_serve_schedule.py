"""``bench/serve/driver.send_on_schedule``: the open-loop send ``bench serve`` and ``bench fleet``
share (each had its own copy): every request at its scheduled arrival, a tenant's open requests
bounded by ``max_in_flight``, the tier its caller reports, records in trace order from the
start. ``send_one`` is faked: no server."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from loraplex.bench.serve import driver
from loraplex.bench.serve.driver import DriveConfig, RequestRecord, seeded_prompts
from loraplex.bench.workloads import TraceRequest

HOLD_S = 0.05  # each fake request stays open this long


def test_requests_go_out_on_schedule_bounded_per_tenant(monkeypatch: pytest.MonkeyPatch) -> None:
    requests = [TraceRequest(0.0, "a", "x", 3, 1)] * 3 + [TraceRequest(0.2, "b", "y", 4, 1)]
    config = DriveConfig(max_in_flight=1, time_scale=0.5)
    open_now: dict[str, int] = {"a": 0, "b": 0}
    most: dict[str, int] = {"a": 0, "b": 0}
    sent: list[tuple[str, float, list[int]]] = []

    async def fake_send(url: str, request: TraceRequest, **kw: Any) -> RequestRecord:
        open_now[request.tenant] += 1
        most[request.tenant] = max(most[request.tenant], open_now[request.tenant])
        sent.append((request.tenant, time.monotonic() - kw["arrival"], kw["ids"]))
        await asyncio.sleep(HOLD_S)
        open_now[request.tenant] -= 1
        return RequestRecord(kw["arrival"], request.tenant, request.adapter, kw["tier"], 200,
                             0.01, None, 1, "r1", None)  # fmt: skip

    monkeypatch.setattr(driver, "send_one", fake_send)

    async def replay() -> list[RequestRecord]:
        return await driver.send_on_schedule(
            "http://x", requests, {"a": "ka", "b": "kb"}, config, start=time.monotonic(),
            tier_of=lambda r: "L0" if r.tenant == "a" else "L3",
            prompts=seeded_prompts(requests, config),
        )  # fmt: skip

    records = asyncio.run(replay())
    assert [r.tenant for r in records] == ["a", "a", "a", "b"]  # trace order
    assert [r.t_s for r in records] == [0.0, 0.0, 0.0, pytest.approx(0.1)]  # from the start
    assert [r.tier for r in records] == ["L0", "L0", "L0", "L3"]
    assert most == {"a": 1, "b": 1}  # a's three went one at a time
    assert all(late >= -1e-3 for _, late, _ in sent)  # none before its arrival
    assert [ids for _, _, ids in sent if len(ids) == 4] == [seeded_prompts(requests, config)[3]]
