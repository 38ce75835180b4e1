"""Cold loads beside running steps: what ``CostModel.load_busy_scale`` prices. Each sample loads
one adapter from the store (L3, its cached pages dropped) twice: alone, then with warm requests
of another adapter decoding while it loads. The scale is the median over the samples of the
second load's stage seconds before the copy (fetch, verify, commit, read) over the first's.

Why: in ``bench sim``'s traces a load from the store that overlapped other requests' steps took
2.8 times its lone price, one that did not 0.97 times (docs/simulator.md, SIMCOLD): the
loader's thread shares the CPU and the interpreter with the engine's. The calibration's other
cold loads are all lone. The requests sent here make ``output_tokens`` other than 1 and
``HOP_OUTPUT_TOKENS``, so neither the lease hand-offs nor the prefill timings read them.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from loraplex.bench.serve.fleet import drop_page_cache
from loraplex.bench.sim.calibrate_loads import (
    copy_sizes,
    evict_everywhere,
    into_slots,
    stage_totals,
)
from loraplex.bench.sim.calibrate_prefill import lone_ttft
from loraplex.bench.sim.calibrate_run import CalibrateConfig, target_sets
from loraplex.bench.sim.calibrate_target import ServedAdapter, Target
from loraplex.residency.stats import Stage

COLD_OUTPUT_TOKENS = 2  # the cold request's tokens (not 1: the hand-offs read those)
BUSY_REQUESTS = 2  # warm requests decoding beside the second load
BUSY_OUTPUT_TOKENS = 48  # each one's tokens: their steps outlast the load
BUSY_HEAD_START_S = 0.05  # the warm requests' start before the cold one (their prefill done)


@dataclass(frozen=True)
class BusySample:
    """One adapter loaded from the store alone and beside running steps."""

    adapter: str  # tenant/name@revision
    lone_s: float  # the load's stage seconds before the copy, the engine idle
    busy_s: float  # the same, BUSY_REQUESTS warm requests decoding

    @property
    def ratio(self) -> float:
        return self.busy_s / self.lone_s


def busy_scale(samples: Sequence[BusySample]) -> float | None:
    """The median ratio over ``samples``; None without any (the scale is then not measured)."""
    ratios = [s.ratio for s in samples if s.lone_s > 0 and s.busy_s > 0]
    return statistics.median(ratios) if ratios else None


def busy_samples(client: httpx.Client, target: Target, config: CalibrateConfig) -> list[BusySample]:
    """``config.repeats`` samples on the lowest- and highest-rank adapter of each target set, the
    warm requests on another adapter held in a slot; an adapter the server would not drop from
    every tier (a copy pinned or in use), or a request that failed, gives no sample."""
    chosen = list(
        dict.fromkeys(a for group in target_sets(target.adapters) for a in (group[0], group[-1]))
    )
    length = min(config.prefill_lengths)
    samples: list[BusySample] = []
    for repeat in range(config.repeats):
        for index, adapter in enumerate(chosen):
            others = [a for a in target.adapters if a != adapter]
            if not others:
                return samples
            warm = others[0]
            seed = config.seed + 71 + 100 * repeat + index
            pair = _Pair(target, adapter, warm, config, length)
            lone = _stages(client, pair, seed, busy=False)
            busy = _stages(client, pair, seed + 1, busy=True)
            if lone is not None and busy is not None:
                samples.append(BusySample(adapter.ref, lone, busy))
    return samples


@dataclass(frozen=True)
class _Pair:
    """One sample's cold adapter, the warm one decoding beside it, and the request shape."""

    target: Target
    adapter: ServedAdapter
    warm: ServedAdapter
    config: CalibrateConfig
    length: int  # prompt tokens of every request


def _stages(client: httpx.Client, pair: _Pair, seed: int, *, busy: bool) -> float | None:
    """One cold request for ``pair.adapter`` (only in the store), with ``pair.warm``'s requests
    decoding beside it when ``busy``: the stage seconds before the copy the server's counters
    gained (the warm requests load nothing); None when no cold load could be made or a request
    failed."""
    target = pair.target
    into_slots(client, target.adapters, (pair.warm,))
    evict_everywhere(client, pair.adapter)
    if copy_sizes(client, pair.adapter):  # a copy stayed (pinned, in use): not a cold load
        return None
    if target.store is not None:
        drop_page_cache(target.store)
    before = stage_totals(client)
    ttfts = asyncio.run(_requests(pair, seed, busy))
    after = stage_totals(client)
    if any(t is None for t in ttfts):
        return None
    return sum(v - before.get(k, 0.0) for k, v in after.items() if k != Stage.COPY.value)


async def _requests(pair: _Pair, seed: int, busy: bool) -> list[float | None]:
    rng = random.Random(seed)
    target, config, length = pair.target, pair.config, pair.length
    background = [
        asyncio.ensure_future(
            lone_ttft(target, pair.warm, config, length, rng, output_tokens=BUSY_OUTPUT_TOKENS)
        )
        for _ in range(BUSY_REQUESTS if busy else 0)
    ]
    if background:
        await asyncio.sleep(BUSY_HEAD_START_S)
    cold = await lone_ttft(
        target, pair.adapter, config, length, rng, tier="L3", output_tokens=COLD_OUTPUT_TOKENS
    )
    return [cold, *await asyncio.gather(*background)]
