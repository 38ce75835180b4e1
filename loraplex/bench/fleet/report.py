"""``loraplex bench fleet``'s figures: each routing policy's statistics per trace (repeats
pooled), the headline ratios between policies, the JSON line and the human table. Ray-free and
HTTP-free: the tests feed it made-up runs.

Rules (WORKLOADS.md): TTFT percentiles count every trace request, a failed or timed-out one at
the client's timeout (``serve_summary.ttft_or_timeout``); the completed ratio stands beside every
latency; a ratio with an unknown side or a denominator that is not > 0 is None (null), never 0.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loraplex.bench.fleet.repeats import Spread, aggregate, median_of, spread_of
from loraplex.bench.harness.stats import ratio
from loraplex.bench.serve.driver import RequestRecord
from loraplex.bench.serve.summary import ttft_or_timeout
from loraplex.residency.ledger import Tier
from loraplex.residency.stats import percentile
from loraplex.router.router import DEFAULT_POLICY

# Every policy in the order of a forward run (ABCD); odd repeats run it backwards.
POLICIES = ("pow2", "ray_multiplex", "affinity", DEFAULT_POLICY)
TRACES = ("zipf-longtail", "hot-burst", "hot-one")


@dataclass(frozen=True)
class Headline:
    """One headline ratio: ``figure`` of ``over`` divided by ``figure`` of ``under``."""

    name: str  # its key in the JSON line
    figure: str  # "l0_hit_ratio" or "p99_ttft_ms"
    over: str  # the numerator's policy
    under: str  # the denominator's policy
    target: str  # what the issue expects (shown in the table, never used to pass or fail)


HEADLINES = (
    Headline("l0_hit_ratio_over_pow2", "l0_hit_ratio", DEFAULT_POLICY, "pow2", ">= 2"),
    Headline(
        "l0_hit_ratio_over_ray_multiplex", "l0_hit_ratio", DEFAULT_POLICY, "ray_multiplex", ">= 1.2"
    ),
    Headline("p99_ttft_pow2_over_default", "p99_ttft_ms", "pow2", DEFAULT_POLICY, ">= 1.5"),
    Headline(
        "p99_ttft_affinity_over_default", "p99_ttft_ms", "affinity", DEFAULT_POLICY, "> 1 hot-burst"
    ),
)


@dataclass(frozen=True)
class ReplicaCounters:
    """One engine replica's cache counters at the end of a run (cumulative since it started,
    and every run starts fresh replicas)."""

    replica_id: str
    acquires: int  # adapter acquires: served from L0, filled from L1 / L2, or misses to L3
    l0_hits: int  # acquires served from a GPU slot
    l0_loads: int  # completed fills into GPU slots (the cold loads)


def counters_since(
    after: Sequence[ReplicaCounters], before: Sequence[ReplicaCounters]
) -> tuple[ReplicaCounters, ...]:
    """Each replica's counters over the measured replay: ``after`` less what it had counted
    ``before`` it (the warm-up); a replica absent before (it joined since) counts from 0."""
    earlier = {c.replica_id: c for c in before}
    out = []
    for c in after:
        b = earlier.get(c.replica_id, ReplicaCounters(c.replica_id, 0, 0, 0))
        hits, loads = c.l0_hits - b.l0_hits, c.l0_loads - b.l0_loads
        out.append(ReplicaCounters(c.replica_id, c.acquires - b.acquires, hits, loads))
    return tuple(out)


def decisions_since(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    """Routing decisions by reason over the measured replay (reasons with none left out)."""
    out = {k: v - before.get(k, 0) for k, v in after.items()}
    return {k: v for k, v in out.items() if v}


def counters_of(status: Mapping[str, Any]) -> ReplicaCounters:
    """A fleet board status (``EngineReplica.status()``) as counters."""
    hits = status["hits"]  # "l0" | "l1" | "l2" -> hits, "miss" -> misses
    loads = status["summary"].stats.loads
    return ReplicaCounters(
        replica_id=str(status["replica_id"]),
        acquires=sum(int(v) for v in hits.values()),
        l0_hits=int(hits["l0"]),
        l0_loads=int(loads.get(Tier.L0, 0)),
    )


@dataclass(frozen=True)
class PolicyRun:
    """One deployment of one routing policy replaying one trace."""

    trace: str  # the workload's name
    policy: str  # the routing policy
    records: tuple[RequestRecord, ...]  # one per trace request, in trace order
    replicas: tuple[ReplicaCounters, ...]  # every replica on the board at the end
    decisions: Mapping[str, int]  # routing decisions by reason (the ingress's /admin/fleet)


def ttft_ms(records: Sequence[RequestRecord], timeout_s: float) -> dict[str, float | None]:
    """P50 / P90 / P99 TTFT in ms over every request (failures at the timeout); None (null)
    for a run without requests."""
    ordered = sorted(ttft_or_timeout(r, timeout_s) * 1000 for r in records)
    qs = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
    return {k: round(percentile(ordered, q), 2) if ordered else None for k, q in qs.items()}


def imbalance(replicas: Sequence[ReplicaCounters]) -> float | None:
    """The busiest replica's acquires over the mean (1.0: even); None without acquires."""
    counts = [r.acquires for r in replicas]
    return ratio(max(counts, default=0), statistics.fmean(counts) if counts else None)


def repeat_figures(run: PolicyRun, timeout_s: float) -> dict[str, Any]:
    """One repeat's figures: its requests, counters and decisions; TTFT percentiles over every
    request (failures at the timeout)."""
    acquires = sum(c.acquires for c in run.replicas)
    l0_hits = sum(c.l0_hits for c in run.replicas)
    l0_loads = sum(c.l0_loads for c in run.replicas)
    completed = sum(r.ok for r in run.records)
    return {
        "requests": len(run.records),
        "completed": completed,
        "completed_ratio": ratio(completed, len(run.records), 4),
        "ttft_ms": ttft_ms(run.records, timeout_s),
        "l0_hit_ratio": ratio(l0_hits, acquires, 4),
        "cold_loads_per_1k_requests": ratio(1000 * l0_loads, len(run.records), 1),
        "acquires": acquires,
        "l0_hits": l0_hits,
        "l0_loads": l0_loads,
        "imbalance": imbalance(run.replicas),
    }


# Figures given as the median over the repeats (with their spread); the counts are summed.
MEDIAN_FIGURES = (
    "completed_ratio",
    "ttft_ms",
    "l0_hit_ratio",
    "cold_loads_per_1k_requests",
    "imbalance",
)
SUMMED_COUNTS = ("requests", "completed", "acquires", "l0_hits", "l0_loads")


def summarize(runs: Sequence[PolicyRun], timeout_s: float) -> dict[str, Any]:
    """One policy on one trace over its repeats (``policy_summary``)."""
    figures = [repeat_figures(run, timeout_s) for run in runs]
    return policy_summary(figures, summed_decisions(runs))


def summed_decisions(runs: Sequence[PolicyRun]) -> dict[str, int]:
    """Routing decisions by reason, summed over ``runs``, reasons sorted."""
    decisions: Counter[str] = Counter()
    for run in runs:
        decisions.update(run.decisions)
    return dict(sorted(decisions.items()))


def policy_summary(
    figures: Sequence[Mapping[str, Any]], decisions: Mapping[str, int]
) -> dict[str, Any]:
    """One policy's repeats (``repeat_figures`` each): every rate, ratio and percentile the
    median of the repeats' (``spread``: their [min, max]), counts and ``decisions`` summed."""
    counts = {k: sum(f[k] for f in figures) for k in SUMMED_COUNTS}
    medians = aggregate(figures, MEDIAN_FIGURES)
    return {"runs": len(figures), **counts, **medians, "decisions": dict(decisions)}


def _figure(summary: Mapping[str, Any] | None, figure: str) -> float | None:
    if summary is None:
        return None
    value = summary["ttft_ms"]["p99"] if figure == "p99_ttft_ms" else summary[figure]
    return None if value is None else float(value)


def headline_repeats(
    figures: Mapping[str, Sequence[Mapping[str, Any]]], h: Headline
) -> list[float | None]:
    """``h``'s ratio per repeat: repeat k of ``h.over`` over repeat k of ``h.under``; [None]
    when a side did not run or the two ran a different number of times."""
    over, under = figures.get(h.over, ()), figures.get(h.under, ())
    if not over or len(over) != len(under):
        return [None]
    return [
        ratio(_figure(a, h.figure), _figure(b, h.figure)) for a, b in zip(over, under, strict=True)
    ]


def trace_metrics(
    figures: Mapping[str, Sequence[Mapping[str, Any]]],
    decisions: Mapping[str, Mapping[str, int]] | None = None,
) -> dict[str, Any]:
    """One trace from each policy's ``repeat_figures`` (in run order) and its decisions by
    reason: the headline ratios (the median of the per-repeat ratios; None where a side did not
    run or is undefined), their ``spread`` and ``per_repeat`` values, each policy's completed
    ratio and cold loads, then every policy's ``policy_summary``."""
    out: dict[str, Any] = {}
    spreads: dict[str, Spread | None] = {}
    per_repeat: dict[str, list[float | None]] = {}
    for h in HEADLINES:
        values = headline_repeats(figures, h)
        out[h.name] = median_of(values, 3)
        spreads[h.name], per_repeat[h.name] = spread_of(values), values
    out["spread"], out["per_repeat"] = spreads, per_repeat
    decided = decisions or {}
    summaries = {p: policy_summary(f, decided.get(p, {})) for p, f in figures.items()}
    out["completed_ratio"] = {p: s["completed_ratio"] for p, s in summaries.items()}
    out["cold_loads_per_1k_requests"] = {
        p: s["cold_loads_per_1k_requests"] for p, s in summaries.items()
    }
    out["policies"] = summaries
    return out


def fleet_metrics(
    runs: Sequence[PolicyRun], traces: Sequence[str], policies: Sequence[str], timeout_s: float
) -> dict[str, Any]:
    """Every trace's ``trace_metrics``, policies in ``policies`` order."""
    out: dict[str, Any] = {}
    for trace in traces:
        figures, decisions = {}, {}
        for policy in policies:
            mine = [r for r in runs if r.trace == trace and r.policy == policy]
            if mine:
                figures[policy] = [repeat_figures(r, timeout_s) for r in mine]
                decisions[policy] = summed_decisions(mine)
        out[trace] = trace_metrics(figures, decisions)
    return out


def fleet_json_line(result: Mapping[str, Any]) -> str:
    """The one JSON line: name, config, seed, metrics (no NaN: undefined values are null)."""
    line = {k: result[k] for k in ("name", "config", "seed", "metrics")}
    return json.dumps(line, allow_nan=False)
