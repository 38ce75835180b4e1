"""The client side of ``loraplex bench fleet``: a trace replayed open-loop through the fleet's
ingress, and the fleet's capacity.

Requests go out as ``bench serve`` sends them (``serve_driver.send_one``: a streaming
/v1/completions call with the tenant's key, TTFT from the scheduled arrival to the first streamed
token, a request bounded by the timeout). Unlike ``bench serve`` nothing polls /admin/residency
during the replay: on a fleet each such read is a cache call to every replica, work on the
shared cores that would fall on the measured runs. The fleet's counters are read once, after
the replay (``fleet_cluster``).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace

from loraplex.bench.serve.driver import (
    DriveConfig,
    RequestRecord,
    seeded_prompts,
    send_on_schedule,
)
from loraplex.bench.workloads import TraceRequest

UNKNOWN_TIER = "L3"  # the tier recorded when the server does not report one


async def replay(
    url: str, requests: Sequence[TraceRequest], keys: dict[str, str], config: DriveConfig
) -> list[RequestRecord]:
    """Replays ``requests`` open-loop against ``url``; one record per request, in trace order,
    ``t_s`` from the start of the replay. Each tenant is a client of its own (its own
    ``max_in_flight`` bound). Prompts come from ``config.seed``: every run of a trace sends the
    same prompts."""
    prompts = seeded_prompts(requests, config)
    start = time.monotonic()
    return await send_on_schedule(
        url, requests, keys, config, start=start, tier_of=lambda _: UNKNOWN_TIER, prompts=prompts
    )


def capacity_batch(
    adapters: Sequence[tuple[str, str]], size: int, prompt_tokens: int, output_tokens: int
) -> list[TraceRequest]:
    """``size`` requests all at t = 0, cycling over ``adapters`` (tenant, name)."""
    if not adapters or size < 1:
        raise ValueError(f"adapters {len(adapters)} / size {size} are invalid; expected >= 1")
    return [
        TraceRequest(0.0, *adapters[i % len(adapters)], prompt_tokens, output_tokens)
        for i in range(size)
    ]


async def burst_rate(
    url: str, batch: Sequence[TraceRequest], keys: dict[str, str], config: DriveConfig
) -> float:
    """Completed requests per second of ``batch`` sent at once (closed: the wall time runs
    until the last one ends)."""
    many = replace(config, max_in_flight=max(config.max_in_flight, len(batch)))
    start = time.monotonic()
    records = await replay(url, batch, keys, many)
    return sum(r.ok for r in records) / (time.monotonic() - start)


def measure_capacity(
    url: str,
    batch: Sequence[TraceRequest],
    keys: dict[str, str],
    config: DriveConfig,
    rounds: int,
) -> tuple[float, ...]:
    """Completed requests per second of ``rounds`` bursts of ``batch``, after one unmeasured
    burst that loads its adapters (the capacity of a fleet whose adapters are resident)."""
    asyncio.run(burst_rate(url, batch, keys, replace(config, seed=config.seed + 1)))
    return tuple(
        asyncio.run(burst_rate(url, batch, keys, replace(config, seed=config.seed + 2 + i)))
        for i in range(rounds)
    )


def median_or_none(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None
