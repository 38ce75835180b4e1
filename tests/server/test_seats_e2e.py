"""Engine seats end to end, the engine in its own process: a tenant whose long streams hold
every seat cannot keep another tenant's request waiting for them to end, and a seat limit set
through the admin API reaches the engine process. Asserts ordering (what ended first), never
timings."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
from live import Live, live_server

from loraplex.demo.assets import DemoAssets

ADMIN = "test-admin-credential-0123456789"
SEATS = 4
LONG = 160  # tokens of each long stream (min_tokens too: an EOS cannot end it early)


async def _stream(live: Live, tenant: str, tokens: int, events: list[str], name: str) -> None:
    """One streamed completion of the base model; logs ``name:first``, ``name:last`` (the event
    with its finish reason: the engine step that freed its seat) and ``name:end``."""
    body = {
        "model": live.server.deps.config.base_model_name,
        "prompt": f"{name} says",
        "max_tokens": tokens,
        "min_tokens": tokens,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {live.key(tenant)}"}
    http = httpx.AsyncClient(base_url=live.url, timeout=120)
    async with http, http.stream("POST", "/v1/completions", json=body, headers=headers) as reply:
        assert reply.status_code == 200, await reply.aread()
        async for line in reply.aiter_lines():
            if not line.startswith("data: {"):
                continue
            if f"{name}:first" not in events:
                events.append(f"{name}:first")
            if any(c.get("finish_reason") for c in json.loads(line[6:])["choices"]):
                events.append(f"{name}:last")
    events.append(f"{name}:end")


async def _until(events: list[str], wanted: set[str]) -> None:
    while not wanted <= set(events):
        await asyncio.sleep(0.01)


async def _hog_and_victim(live: Live) -> list[str]:
    events: list[str] = []
    hogs = [
        asyncio.create_task(_stream(live, "acme", LONG, events, f"hog{i}")) for i in range(SEATS)
    ]
    await asyncio.wait_for(_until(events, {f"hog{i}:first" for i in range(SEATS)}), 120)
    await _stream(live, "globex", 2, events, "victim")  # every seat is a hog's now
    await asyncio.gather(*hogs)
    return events


async def _capped(live: Live) -> list[str]:
    events: list[str] = []
    await asyncio.gather(*(_stream(live, "initech", 24, events, f"c{i}") for i in range(2)))
    return events


def test_a_hog_holding_every_seat_does_not_keep_another_tenant_waiting(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    with live_server(demo_assets, tmp_path, admin_key=ADMIN, max_num_seqs=SEATS) as live:
        events = asyncio.run(_hog_and_victim(live))
        victim_end = events.index("victim:end")
        assert all(events.index(f"hog{i}:end") > victim_end for i in range(SEATS)), events

        limit = {"quotas": {"max_running_seqs": 1}}
        reply = httpx.put(
            f"{live.url}/admin/tenants/initech",
            json=limit,
            headers={"Authorization": f"Bearer {ADMIN}"},
        )
        assert reply.status_code == 200, reply.text
        events = asyncio.run(_capped(live))
        # one seat: one at a time. NOTE: compared with the first one's finishing event, not its
        # stream's close: the seat is free once that event's step ends, and the next stream's
        # first token could reach this client before the first stream's close did.
        first_last = min(events.index("c0:last"), events.index("c1:last"))
        later = "c1" if events.index("c0:last") == first_last else "c0"
        assert events.index(f"{later}:first") > first_last, events
