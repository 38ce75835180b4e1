"""Cold loads beside running steps: what ``CostModel.load_busy_scale`` prices. Each sample loads
one adapter from the store (L3, its cached pages dropped) twice: alone, then beside a
``BusyMix`` of warm requests on another adapter: some decoding through the load and some
arriving with it, whose prefills (and the front's work for them) run while it loads, as a
trace's do. The scale is the median over the samples of the second load's stage seconds before
the copy (fetch, verify, commit, read) over the first's. Each sample also keeps the copy's stage
seconds of both loads (``copy_lone_s``, ``copy_busy_s``): the server times the copy from before
it takes the slot lock every forward holds, so beside steps it holds the wait for the step in
flight (``CostModel.copy_waits_for_step``; the calibration's report shows them).

Why: in ``bench sim``'s traces a load from the store that overlapped other requests' steps took
2.8 times its lone price, one that did not 0.97 times (docs/simulator.md, SIMCOLD): the
loader's thread shares the CPU and the interpreter with the engine's. Beside 2 decoding
requests alone (``LIGHT_MIX``, the mix before 2026-12-06) a quiet calibration read 1.55, and
the simulated tail barely moved (docs/simulator.md, SIMTAIL: the trace's busy loads ran beside
2-4+ requests and several prefills). The calibration's other cold loads are all lone. The
requests sent here make ``output_tokens`` other than 1 and ``HOP_OUTPUT_TOKENS``, so neither
the lease hand-offs nor the prefill timings read them.
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


@dataclass(frozen=True)
class BusyMix:
    """The warm requests run beside a sample's second load."""

    decoding: int = 2  # warm requests decoding through the load
    decode_tokens: int = 48  # each one's tokens: their steps outlast the load
    head_start_s: float = 0.05  # their start before the cold request (their prefill done)
    arrivals: int = 4  # warm requests sent from the cold one's send on: prefills during the load
    arrival_gap_s: float = 0.004  # between two arrivals' sends
    arrival_tokens: int = 4  # each arrival's tokens (not 1, 2 or HOP_OUTPUT_TOKENS)

    def __post_init__(self) -> None:
        if self.decoding < 0 or self.arrivals < 0 or self.decoding + self.arrivals < 1:
            raise ValueError(
                f"decoding {self.decoding}, arrivals {self.arrivals} is invalid; expected counts "
                ">= 0 and at least one request"
            )
        if self.decode_tokens < 3 or self.arrival_tokens < 3:
            raise ValueError(
                f"decode_tokens {self.decode_tokens}, arrival_tokens {self.arrival_tokens} is "
                "invalid; expected >= 3 (the hand-offs read 1-token requests, the cold one is 2)"
            )
        if self.head_start_s < 0 or self.arrival_gap_s < 0:
            raise ValueError(
                f"head_start_s {self.head_start_s}, arrival_gap_s {self.arrival_gap_s} is "
                "invalid; expected >= 0"
            )

    def describe(self) -> str:
        return (
            f"{self.decoding} warm requests decoding ({self.decode_tokens} tokens, sent "
            f"{self.head_start_s * 1e3:g} ms before the cold one) and {self.arrivals} arriving "
            f"({self.arrival_tokens} tokens, sent {self.arrival_gap_s * 1e3:g} ms apart from the "
            "cold one's send)"
        )


LIGHT_MIX = BusyMix(arrivals=0)  # the mix measured before 2026-12-06: 2 decoding requests
TRACE_MIX = BusyMix()  # decoding requests and prefills arriving during the load


@dataclass(frozen=True)
class BusySample:
    """One adapter loaded from the store alone and beside running steps."""

    adapter: str  # tenant/name@revision
    lone_s: float  # the load's stage seconds before the copy, the engine idle
    busy_s: float  # the same, a ``BusyMix`` beside it
    copy_lone_s: float | None = None  # the copy's stage seconds, the engine idle (None: not kept)
    copy_busy_s: float | None = None  # the same beside the mix: with the wait for the slot lock

    @property
    def ratio(self) -> float:
        return self.busy_s / self.lone_s


def busy_scale(samples: Sequence[BusySample]) -> float | None:
    """The median ratio over ``samples``; None without any (the scale is then not measured)."""
    ratios = [s.ratio for s in samples if s.lone_s > 0 and s.busy_s > 0]
    return statistics.median(ratios) if ratios else None


def busy_samples(
    client: httpx.Client, target: Target, config: CalibrateConfig, mix: BusyMix = TRACE_MIX
) -> list[BusySample]:
    """``config.repeats`` samples on the lowest- and highest-rank adapter of each target set, the
    warm requests (``mix``) on another adapter held in a slot; an adapter the server would not
    drop from every tier (a copy pinned or in use), or a request that failed, gives no sample."""
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
            pair = _Pair(target, adapter, warm, config, length, mix)
            lone = _stages(client, pair, seed, busy=False)
            busy = _stages(client, pair, seed + 1, busy=True)
            if lone is not None and busy is not None:
                samples.append(BusySample(adapter.ref, lone[0], busy[0], lone[1], busy[1]))
    return samples


def copy_medians(samples: Sequence[BusySample]) -> tuple[float, float] | None:
    """The median copy stage seconds of the samples' lone and busy loads; None when no sample
    kept both (the wait for the slot lock is their difference)."""
    kept = [s for s in samples if s.copy_lone_s is not None and s.copy_busy_s is not None]
    if not kept:
        return None
    lone = statistics.median(s.copy_lone_s for s in kept if s.copy_lone_s is not None)
    busy = statistics.median(s.copy_busy_s for s in kept if s.copy_busy_s is not None)
    return lone, busy


@dataclass(frozen=True)
class _Pair:
    """One sample's cold adapter, the warm one decoding beside it, and the request shape."""

    target: Target
    adapter: ServedAdapter
    warm: ServedAdapter
    config: CalibrateConfig
    length: int  # prompt tokens of every request
    mix: BusyMix  # what runs beside the busy load


def _stages(
    client: httpx.Client, pair: _Pair, seed: int, *, busy: bool
) -> tuple[float, float] | None:
    """One cold request for ``pair.adapter`` (only in the store), with ``pair.warm``'s requests
    (``pair.mix``) beside it when ``busy``: the stage seconds before the copy the server's counters
    gained (the warm requests load nothing), and the copy's; None when no cold load could be
    made or a request failed."""
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
    gained = {k: v - before.get(k, 0.0) for k, v in after.items()}
    copy_s = gained.pop(Stage.COPY.value, 0.0)
    return sum(gained.values()), copy_s


async def _requests(pair: _Pair, seed: int, busy: bool) -> list[float | None]:
    rng = random.Random(seed)
    target, config, length, mix = pair.target, pair.config, pair.length, pair.mix

    def warm(tokens: int) -> asyncio.Future[float | None]:
        return asyncio.ensure_future(
            lone_ttft(target, pair.warm, config, length, rng, output_tokens=tokens)
        )

    async def arriving() -> list[float | None]:
        sent = []
        for i in range(mix.arrivals):
            if i:
                await asyncio.sleep(mix.arrival_gap_s)
            sent.append(warm(mix.arrival_tokens))
        return list(await asyncio.gather(*sent))

    background = [warm(mix.decode_tokens) for _ in range(mix.decoding if busy else 0)]
    if background:
        await asyncio.sleep(mix.head_start_s)
    cold = asyncio.ensure_future(
        lone_ttft(
            target, pair.adapter, config, length, rng, tier="L3", output_tokens=COLD_OUTPUT_TOKENS
        )
    )
    arrived = await arriving() if busy else []
    return [await cold, *await asyncio.gather(*background), *arrived]
