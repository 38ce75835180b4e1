"""End-to-end loads: what a lone request for an adapter not in a GPU slot waits beyond the same
adapter's warm TTFT and the stage seconds the server's counters hold (the hand-offs between the
loader's stages and the engine's steps, which no stage counter times), from two places: only in
the store (L3) and only in CPU memory (L1, the copy into a slot alone). ``sim calibrate`` adds
the L1 median to the L1 -> L0 link's fixed seconds (every load into a slot passes it) and what
the L3 median adds beyond it to the L3 -> L2 link's, so the simulator charges a load what a
request sees, not only what its stages spend."""

from __future__ import annotations

import asyncio
import heapq
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from loraplex.bench.serve.fleet import drop_page_cache
from loraplex.bench.sim.calibrate_loads import (
    copy_sizes,
    evict_everywhere,
    into_slots,
    prefetch,
    stage_totals,
)
from loraplex.bench.sim.calibrate_prefill import lone_ttft
from loraplex.bench.sim.calibrate_run import CalibrateConfig, target_sets
from loraplex.bench.sim.calibrate_target import Target
from loraplex.sim.calibrate import FirstFit, FirstSample, HopSample, fit_first


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


@dataclass(frozen=True)
class LeaseHandoffs:
    """``lease_handoff_s`` measured on the engine's timelines of the calibration's lone requests."""

    seconds: dict[str, float]  # source tier -> the median hand-off (floored at 0)
    counts: dict[str, int]  # source tier -> the requests it is the median of
    at_once_plan_s: float  # the median plan of lone requests leased at once (L0), after the ask
    at_once: int  # ... over this many
    # The median ask (``asked_s``) of the lone requests whose lease waited, less that of those
    # leased at once (floored at 0): ``lease_ask_s``; the hand-offs are counted from the ask.
    ask_s: float = 0.0
    at_once_ask_s: float = 0.0  # the median ask of the lone requests leased at once


def lease_handoffs(lines: Sequence[Mapping[str, Any]]) -> LeaseHandoffs | None:
    """From a server's request log (``server/request_log.py``), over its lone requests
    (``output_tokens`` 1: the cold samples and the prefill samples): the ask, the median
    ``asked_s`` of those whose lease waited (``engine.ready_s`` set) less the median of those
    leased at once (tier L0): what asking for a lease on a miss holds the engine thread beyond a
    hit's (the cache lock, the policy's choice, the load's submission); and per tier a lease
    waited for a load from, the median over the requests that waited of the plan of their first
    step (``scheduled_s``) less their ask and their load's stage seconds (``load_s``), less the
    median plan after the ask of those leased at once: what a waiting lease costs its request
    after the ask beyond its stages (the loader's pick-up, the lease's return to the engine
    thread). None without requests leased at once or without any that waited. A line without
    ``asked_s`` counts as asked on arrival (0): with none, no ask and the hand-offs as before."""
    lone = [
        (str(line["tier"]), line["engine"])
        for line in lines
        if line.get("output_tokens") == 1
        and isinstance(line.get("engine"), dict)
        and line["engine"].get("scheduled_s") is not None
    ]
    once = [e for tier, e in lone if tier == "L0" and e.get("ready_s") is None]
    waits = [(tier, e) for tier, e in lone if tier != "L0" and e.get("ready_s") is not None]
    if not once or not waits:
        return None
    once_ask = statistics.median(_asked(e) for e in once)
    base = statistics.median(float(e["scheduled_s"]) - _asked(e) for e in once)
    waited: dict[str, list[float]] = {}
    for tier, e in waits:
        after_ask = float(e["scheduled_s"]) - _asked(e) - float(e["load_s"])
        waited.setdefault(tier, []).append(after_ask)
    ask = statistics.median(_asked(e) for _, e in waits) - once_ask
    return LeaseHandoffs(
        seconds={t: max(0.0, statistics.median(v) - base) for t, v in sorted(waited.items())},
        counts={t: len(v) for t, v in sorted(waited.items())},
        at_once_plan_s=base,
        at_once=len(once),
        ask_s=max(0.0, ask),
        at_once_ask_s=once_ask,
    )


def _asked(engine: Mapping[str, Any]) -> float:
    """A timeline's ``asked_s`` (0 where absent)."""
    asked = engine.get("asked_s")
    return 0.0 if asked is None else float(asked)


def first_requests(lines: Sequence[Mapping[str, Any]], sizes: Mapping[str, int]) -> FirstFit:
    """A fresh server's one-time seconds from its request log (``lines``, the server started by
    the calibration with its log, so its first line is its first request): the first request
    by arrival, when it is a lone cold one, against the later lone cold requests
    (``sim/calibrate.fit_first``). Lone: nothing else in flight from its arrival to its end;
    cold: leased from L3 after a load (``engine.load_s`` > 0), its first step and TTFT timed.
    ``sizes``: ``tenant/name@revision`` -> the adapter's bytes."""
    if not lines:
        return fit_first(None, (), "the server's request log holds no request")
    spans = [(float(x["t_s"]), float(x["t_s"]) + float(x.get("latency_s") or 0.0)) for x in lines]
    order = sorted(range(len(lines)), key=lambda i: spans[i][0])

    def sample(i: int) -> FirstSample | None:
        line, (start, end) = lines[i], spans[i]
        e = line.get("engine")
        if (
            line.get("tier") != "L3"
            or not isinstance(e, dict)
            or not e.get("load_s")
            or e.get("scheduled_s") is None
            or e.get("first_step_end_s") is None
            or line.get("ttft_s") is None
            or any(s < end and start < t for j, (s, t) in enumerate(spans) if j != i)
        ):
            return None
        ref = f"{line.get('tenant')}/{line.get('adapter')}"
        if sizes.get(ref, 0) <= 0:
            return None
        return FirstSample(
            adapter=ref,
            nbytes=sizes[ref],
            load_s=float(e["load_s"]),
            step_s=float(e["first_step_end_s"]) - float(e["scheduled_s"]),
            hop_s=float(line["ttft_s"]) - float(e["first_step_end_s"]),
        )

    first = sample(order[0])
    if first is None:
        return fit_first(
            None,
            (),
            "the server's first request was not a lone cold (L3) request of an adapter of "
            f"known size with its engine timeline ({lines[order[0]].get('adapter')}, tier "
            f"{lines[order[0]].get('tier')})",
        )
    later = [s for i in order[1:] if (s := sample(i)) is not None]
    return fit_first(first, later)


def hop_samples(lines: Sequence[Mapping[str, Any]]) -> list[HopSample]:
    """One server's request log (``lines``, ``t_s`` and ``latency_s`` on its clock) as hop
    samples: each request with a first token and an engine timeline, its time outside the
    engine (``ttft_s`` less ``engine.first_step_end_s``) and whether another request had arrived
    and not ended when it arrived (``CostModel.hop_busy_s``). The log's first request is left
    out (``first_hop_s`` prices its one-time reply)."""
    spans = sorted(
        (float(x["t_s"]), float(x["t_s"]) + float(x.get("latency_s") or 0.0), x)
        for x in lines
        if isinstance(x.get("t_s"), (int, float))
    )
    ends: list[float] = []  # heap of the end times of the requests arrived so far
    out = []
    for i, (start, end, line) in enumerate(spans):
        while ends and ends[0] <= start:
            heapq.heappop(ends)
        busy = bool(ends)
        heapq.heappush(ends, end)
        e = line.get("engine")
        if i == 0 or not isinstance(e, dict) or line.get("ttft_s") is None:
            continue
        if e.get("first_step_end_s") is None:
            continue
        out.append(HopSample(float(line["ttft_s"]) - float(e["first_step_end_s"]), busy))
    return out
