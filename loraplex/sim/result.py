"""A simulation's figures, named as ``bench serve`` / ``bench fleet`` name theirs.

Every figure is deterministic for a given trace, config and cost model (no wall time here).
Ratios whose denominator is 0 are None (null), never 0; a failed request counts in the TTFT
percentiles as ``SimConfig.timeout_s`` (WORKLOADS.md: failures count). A request the server
refuses at once (``Outcome.refused``: a 400 before any queue) is counted in ``refused`` and in
no TTFT percentile, as ``bench sim``'s real side counts a 400 reply (``bench/sim/validate.py``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loraplex.residency.cache.view import CacheSummary
from loraplex.residency.ledger import CACHED_TIERS
from loraplex.residency.stats import percentile
from loraplex.sim.outcome import Outcome

TIERS = ("L0", "L1", "L2", "L3")
SCHEMA = "loraplex-sim-result/1"


@dataclass(frozen=True)
class SimResult:
    """One run: its inputs' description and its figures (docs/simulator.md, "Output")."""

    config: dict[str, Any]  # the SimConfig, the cost model's hardware, the trace's size
    metrics: dict[str, Any]  # the figures (module docstring)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "config": self.config, "metrics": self.metrics}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)


def ratio(numerator: float, denominator: float, digits: int = 4) -> float | None:
    return round(numerator / denominator, digits) if denominator else None


def ttft_ms(outcomes: Sequence[Outcome], timeout_s: float) -> dict[str, float | None]:
    """Count and P50/P90/P99 TTFT in ms over every request not refused at arrival (a failed
    one at ``timeout_s``)."""
    values = sorted(1000 * _ttft(o, timeout_s) for o in outcomes if o.refused is None)
    qs = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
    if not values:
        return {"n": 0, **dict.fromkeys(qs)}
    return {"n": len(values), **{k: round(percentile(values, q), 3) for k, q in qs.items()}}


def _ttft(outcome: Outcome, timeout_s: float) -> float:
    if not outcome.ok or outcome.first_token_s is None:
        return timeout_s
    return max(outcome.first_token_s - outcome.t_s, 0.0)


def _group(outcomes: Sequence[Outcome], timeout_s: float) -> dict[str, Any]:
    done = sum(o.ok for o in outcomes)
    return {
        "requests": len(outcomes),
        "completed": done,
        "completed_ratio": ratio(done, len(outcomes)),
        "ttft_ms": ttft_ms(outcomes, timeout_s),
        "tier_at_lease": {t: sum(o.tier == t for o in outcomes) for t in TIERS},
    }


def _grouped(
    outcomes: Sequence[Outcome], key: Callable[[Outcome], str], timeout_s: float
) -> dict[str, Any]:
    groups: dict[str, list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault(key(o), []).append(o)
    return {k: _group(groups[k], timeout_s) for k in sorted(groups)}


def cache_figures(summaries: Sequence[CacheSummary], num_requests: int) -> dict[str, Any]:
    """Hit ratios per tier over acquires (L3: misses), loads, evictions, reloads, summed over
    the replicas' caches (``bench serve``'s ``hit_ratio``; ``bench fleet``'s L0 figures)."""
    hits = {t.name: sum(s.stats.hits[t] for s in summaries) for t in CACHED_TIERS}
    hits["L3"] = sum(s.stats.misses for s in summaries)
    acquires = sum(hits.values())
    evictions = {t.name: sum(s.stats.evictions[t] for s in summaries) for t in CACHED_TIERS}
    reloads = {
        t.name: sum(s.stats.reloads_after_eviction[t] for s in summaries) for t in CACHED_TIERS
    }
    loads = {t.name: sum(s.stats.loads[t] for s in summaries) for t in CACHED_TIERS}
    return {
        "hit_ratio": {t: ratio(hits[t], acquires) for t in TIERS},
        "acquires": acquires,
        "l0_hits": hits["L0"],
        "l0_hit_ratio": ratio(hits["L0"], acquires),
        "l0_loads": loads["L0"],
        "loads": loads,
        # NOTE: a cold load is a fill of a GPU slot (L0), as bench fleet counts it; the acquires
        # that reached the artifact store are store_loads (called cold_loads before 2026-12-07).
        "cold_loads_per_1k_requests": ratio(1000 * loads["L0"], num_requests, 1),
        "store_loads": hits["L3"],
        "evictions": evictions,
        "reloads_after_eviction": reloads,
        "thrash_ratio": ratio(sum(reloads.values()), sum(evictions.values())),
        "load_failures": sum(s.stats.load_failures for s in summaries),
    }


def request_figures(outcomes: Sequence[Outcome], timeout_s: float) -> dict[str, Any]:
    """TTFT (all, warm = leased from L0, cold = loaded), throughput, per tenant and per tier."""
    ends = [o.end_s for o in outcomes if o.end_s is not None]
    start = min((o.t_s for o in outcomes), default=0.0)
    makespan = max(ends, default=start) - start
    done = [o for o in outcomes if o.ok]
    errors = Counter(o.error for o in outcomes if o.error is not None and o.refused is None)
    refused = Counter(o.refused for o in outcomes if o.refused is not None)
    return {
        **_group(outcomes, timeout_s),
        "ttft_ms_warm": ttft_ms([o for o in outcomes if o.tier == "L0"], timeout_s),
        "ttft_ms_cold": ttft_ms([o for o in outcomes if o.tier in TIERS[1:]], timeout_s),
        "makespan_s": round(makespan, 6),
        "throughput_requests_per_s": ratio(len(done), makespan, 3),
        "throughput_tokens_per_s": ratio(sum(o.output_tokens for o in done), makespan, 3),
        "errors": dict(sorted(errors.items())),
        "refused": dict(sorted(refused.items())),
        "by_tier": _grouped(outcomes, lambda o: o.tier or "none", timeout_s),
        "by_tenant": _grouped(outcomes, lambda o: o.tenant, timeout_s),
    }


def fleet_figures(
    outcomes: Sequence[Outcome], decisions: Mapping[str, int], num_replicas: int
) -> dict[str, Any]:
    """Routing decisions by reason and the busiest replica's requests over the mean."""
    per_replica = Counter(o.replica for o in outcomes if o.replica >= 0)
    counts = [per_replica.get(i, 0) for i in range(num_replicas)]
    mean = sum(counts) / num_replicas
    return {
        "decisions": dict(sorted(decisions.items())),
        "imbalance": ratio(max(counts, default=0), mean, 3),
        "requests_per_replica": counts,
    }
