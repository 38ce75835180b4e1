"""A calibration's prefill samples: lone warm requests on each target set's lowest- and
highest-rank adapter, paced as ``bench sim``'s real runs send a trace's requests
(``calibrate_run.paced_requests``); their median TTFT less ``front_s`` is one prefill step plus
the front-to-engine hop. ``lone_ttft`` is one such request, unpaced (the cold requests')."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import replace

import httpx

from loraplex.bench.serve.driver import prompt_ids, replay_over_http, send_one
from loraplex.bench.sim.calibrate_loads import into_slots
from loraplex.bench.sim.calibrate_run import (
    CalibrateConfig,
    drive_config,
    paced_requests,
    target_sets,
    weight_regressors,
)
from loraplex.bench.sim.calibrate_target import ServedAdapter, Target
from loraplex.bench.workloads import TraceRequest
from loraplex.sim.calibrate import StepSample


def prefill_adapters(target: Target) -> tuple[ServedAdapter, ...]:
    """The adapters of the prefill samples: each target set's lowest- and highest-rank one."""
    groups = target_sets(target.adapters)
    return tuple(dict.fromkeys(a for group in groups for a in (group[0], group[-1])))


def prefill_samples(
    client: httpx.Client, target: Target, config: CalibrateConfig, front_s: float
) -> tuple[list[StepSample], list[float], list[tuple[StepSample, float]]]:
    """One hop sample per prefill length and adapter (lowest and highest rank): the median TTFT
    of lone warm requests less ``front_s``; none where that is not > 0. With them, every lone
    request's TTFT less its sample's median (the spread the cost model's ``hop_jitter_s``
    keeps), and every kept sample's lone requests as (sample, TTFT less ``front_s``), whose
    median beyond the fitted step is the hop (``sim/calibrate.median_hop_s``)."""
    chosen = prefill_adapters(target)
    samples, residuals, lone = [], [], []
    into_slots(client, target.adapters, tuple(chosen))
    for adapter in chosen:
        byte_tokens, width = weight_regressors((adapter,))
        for index, length in enumerate(config.prefill_lengths):
            seed = config.seed + 7 + 100 * index + adapter.rank
            ttfts = asyncio.run(_warm_ttfts(target, adapter, config, length, seed))
            step_s = statistics.median(ttfts) - front_s if ttfts else 0.0
            residuals += [t - statistics.median(ttfts) for t in ttfts]
            if step_s > 0:
                rank_tokens = length * adapter.rank
                sample = StepSample(
                    0, length, 1, rank_tokens, step_s, True, length * byte_tokens, width
                )
                samples.append(sample)
                lone += [(sample, t - front_s) for t in ttfts]
    return samples, residuals, lone


async def lone_ttft(
    target: Target,
    adapter: ServedAdapter,
    config: CalibrateConfig,
    length: int,
    rng: random.Random,
    *,
    tier: str = "L0",
    output_tokens: int = 1,
) -> float | None:
    """One request of ``length`` prompt tokens and ``max_tokens`` ``output_tokens`` on
    ``adapter``, alone: its TTFT in seconds (None if it failed); ``tier`` is where the caller
    put the adapter."""
    request = TraceRequest(0.0, adapter.tenant, adapter.name, length, output_tokens)
    record = await send_one(
        target.url,
        request,
        key=target.keys[adapter.tenant],
        ids=prompt_ids(rng, length, target.vocab_size),
        arrival=time.monotonic(),
        tier=tier,
        config=drive_config(target, config),
    )
    return record.ttft_s if record.ok else None


def hop_requests(
    adapter: ServedAdapter, config: CalibrateConfig, length: int
) -> list[TraceRequest]:
    """The lone warm requests of one prefill sample, paced (``paced_requests``)."""
    return paced_requests(
        adapter.tenant, adapter.name, length, count=config.overhead_requests,
        gap_s=config.hop_gap_s, output_tokens=config.hop_output_tokens,
    )  # fmt: skip


async def _warm_ttfts(
    target: Target, adapter: ServedAdapter, config: CalibrateConfig, length: int, seed: int
) -> list[float]:
    """The TTFTs of one prefill sample's lone warm requests, replayed as ``bench sim`` replays a
    trace (its client, its arrival clock, its residency poller)."""
    drive = replace(drive_config(target, config), seed=seed)
    requests = hop_requests(adapter, config, length)
    records, _ = await replay_over_http(target.url, requests, target.keys, target.admin_key, drive)
    return [r.ttft_s for r in records if r.ok and r.ttft_s is not None]
