"""End-to-end loads: what a lone request for an adapter not in a GPU slot waits beyond the same
adapter's warm TTFT and the stage seconds the server's counters hold (the hand-offs between the
loader's stages and the engine's steps, which no stage counter times), from two places: only in
the store (L3) and only in CPU memory (L1, the copy into a slot alone). ``sim calibrate`` adds
the L1 median to the L1 -> L0 link's fixed seconds (every load into a slot passes it) and what
the L3 median adds beyond it to the L3 -> L2 link's, so the simulator charges a load what a
request sees, not only what its stages spend."""

from __future__ import annotations

import asyncio
import random
import statistics
from dataclasses import dataclass

import httpx

from loraplex.bench.serve.fleet import drop_page_cache
from loraplex.bench.sim.calibrate_run import (
    CalibrateConfig,
    copy_sizes,
    evict_everywhere,
    into_slots,
    lone_ttft,
    prefetch,
    stage_totals,
    target_sets,
)
from loraplex.bench.sim.calibrate_target import Target


@dataclass(frozen=True)
class ColdSample:
    """One lone request for an adapter in the store, and the same request warm right after."""

    adapter: str  # tenant/name@revision
    cold_ttft_s: float  # TTFT with the adapter only in ``tier`` (store pages dropped for L3)
    warm_ttft_s: float  # TTFT of the next request, the adapter in L0
    stage_s: float  # the server's stage seconds spent on the cold request's load
    tier: str = "L3"  # where the adapter was at the cold request: L3 (store only), L1 (CPU only)

    @property
    def handoff_s(self) -> float:
        """The cold request's wait that neither its warm TTFT nor its stages explain."""
        return self.cold_ttft_s - self.warm_ttft_s - self.stage_s


def cold_samples(
    client: httpx.Client, target: Target, config: CalibrateConfig, tier: str = "L3"
) -> list[ColdSample]:
    """``config.repeats`` cold-then-warm pairs on the lowest- and highest-rank adapter of each
    target set, every slot emptied first (no eviction in the figure), the adapter only in
    ``tier`` (L3: dropped from every tier; L1: then loaded into CPU memory); an adapter the
    server would not drop from every tier (a copy pinned or in use) gives no sample."""
    if tier not in ("L3", "L1"):
        raise ValueError(f"tier {tier!r} is invalid; expected L3 or L1")
    chosen = dict.fromkeys(
        a for group in target_sets(target.adapters) for a in (group[0], group[-1])
    )
    length = min(config.prefill_lengths)
    samples = []
    for repeat in range(config.repeats):
        for index, adapter in enumerate(chosen):
            into_slots(client, target.adapters, ())
            evict_everywhere(client, adapter)
            if copy_sizes(client, adapter):  # a copy stayed (pinned, in use): not a cold load
                continue
            if tier == "L1":
                prefetch(client, adapter, "L1")
                if "L0" in copy_sizes(client, adapter):  # not in CPU memory alone
                    continue
            elif target.store is not None:
                drop_page_cache(target.store)
            seed = config.seed + 31 + 100 * repeat + index
            before = stage_totals(client)
            cold = asyncio.run(
                lone_ttft(target, adapter, config, length, random.Random(seed), tier=tier)
            )
            stage_s = sum(stage_totals(client).values()) - sum(before.values())
            warm = asyncio.run(lone_ttft(target, adapter, config, length, random.Random(seed + 1)))
            if cold is not None and warm is not None:
                samples.append(ColdSample(adapter.ref, cold, warm, stage_s, tier))
    return samples


def handoff_seconds(samples: list[ColdSample]) -> float:
    """The median hand-off over ``samples``, at least 0 (0 without samples)."""
    if not samples:
        return 0.0
    return max(0.0, statistics.median(s.handoff_s for s in samples))
