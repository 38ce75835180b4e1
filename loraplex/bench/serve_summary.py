"""``loraplex bench serve``'s summaries: per-run statistics from the request records and the
headline ratios from those. Undefined values (no data) are None, which the JSON line shows as
null, never 0.0: for a lower-is-better ratio, 0.0 would read as a perfect result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from loraplex.bench.serve_driver import TIERS, RequestRecord, ResidencyView
from loraplex.residency.stats import percentile

STEADY_TENANTS = ("steady-a", "steady-b")


@dataclass(frozen=True)
class RunResult:
    """One server run: the records and the cache's view."""

    name: str  # e.g. "hot-burst/lru"
    records: tuple[RequestRecord, ...]  # one per trace request
    residency: ResidencyView  # tiers at arrival, hit series, final cache stats
    burst_start_s: float | None = None  # hot-burst: when the batch sweep starts


def _ms(values: Sequence[float | None]) -> dict[str, float | None]:
    """Count and percentiles in ms; the percentiles of no values are None (null), never 0."""
    ordered = sorted(v * 1000 for v in values if v is not None)
    qs = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
    if not ordered:
        return {"n": 0, **{k: None for k in qs}}
    return {"n": len(ordered), **{k: round(percentile(ordered, q), 2) for k, q in qs.items()}}


def _grouped(
    records: Sequence[RequestRecord], group: Callable[[RequestRecord], str]
) -> dict[str, dict[str, Any]]:
    keys = sorted({group(r) for r in records})
    out = {}
    for key in keys:
        mine = [r for r in records if group(r) == key and r.ok]
        out[key] = {
            "ttft_ms": _ms([r.ttft_s for r in mine]),
            "tpot_ms": _ms([r.tpot_s for r in mine]),
            "tier_at_arrival": {t: sum(r.tier == t for r in mine) for t in TIERS},
        }
    return out


def hit_ratios(stats: dict[str, object]) -> dict[str, float | None]:
    """Fraction of adapter acquires served from each tier (L3: misses to the artifact store);
    None for every tier when there was no acquire."""
    hits = stats.get("hits")
    counts = {str(k): int(v) for k, v in hits.items()} if isinstance(hits, dict) else {}
    misses = stats.get("misses", 0)
    counts["L3"] = int(misses) if isinstance(misses, int) else 0
    total = sum(counts.values())
    return {t: round(counts.get(t, 0) / total, 4) if total else None for t in TIERS}


def summarize(run: RunResult) -> dict[str, Any]:
    records = run.records
    statuses: dict[str, int] = {}
    for r in records:
        label = str(r.status) if r.error is None or r.status != 200 else f"{r.status}-error"
        statuses[label] = statuses.get(label, 0) + 1
    arrival = {t: sum(r.tier == t for r in records) for t in TIERS}
    stats = run.residency.final
    warm = [r.ttft_s for r in records if r.ok and r.tier == "L0" and r.tenant in STEADY_TENANTS]
    return {
        "warm_p99_ttft_ms": _ms(warm)["p99"],
        "requests": len(records),
        "completed": sum(r.ok for r in records),
        "statuses": statuses,
        "tier_at_arrival": arrival,
        "hit_ratio": hit_ratios(stats),
        "thrash_ratio": _thrash(stats),
        "ttft_ms": _ms([r.ttft_s for r in records if r.ok]),
        "by_tier": _grouped(records, lambda r: r.tier),
        "by_tenant": _grouped(records, lambda r: r.tenant),
        **(
            {}
            if run.burst_start_s is None
            else {
                "from_burst_by_tenant": _grouped(
                    [r for r in records if r.t_s >= run.burst_start_s], lambda r: r.tenant
                ),
            }
        ),
    }


def _thrash(stats: dict[str, object]) -> float | None:
    """Reloads per eviction; None without evictions (or without the counters)."""
    evictions, reloads = stats.get("evictions"), stats.get("reloads_after_eviction")
    if not isinstance(evictions, dict) or not isinstance(reloads, dict):
        return None
    total = sum(int(v) for v in evictions.values())
    return round(sum(int(v) for v in reloads.values()) / total, 4) if total else None


def _quantile(
    summary: dict[str, Any], tenant: str, q: str = "p99", groups: str = "by_tenant"
) -> float | None:
    """A TTFT percentile (ms) of ``tenant``'s completed requests; None when it has none."""
    value = summary[groups].get(tenant, {}).get("ttft_ms", {}).get(q)
    return None if value is None else float(value)


def _in_l0(summary: dict[str, Any], tenant: str, groups: str = "by_tenant") -> float | None:
    """Share of ``tenant``'s completed requests whose adapter was in a GPU slot on arrival."""
    group = summary[groups].get(tenant)
    if not group or not group["ttft_ms"]["n"]:
        return None
    return round(int(group["tier_at_arrival"]["L0"]) / int(group["ttft_ms"]["n"]), 4)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    """None (null) when either side is unknown or the denominator is not > 0; never 0.0."""
    if numerator is None or denominator is None or not denominator > 0:
        return None
    return round(numerator / denominator, 3)


def headline(summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's three ratios plus the numbers they come from."""
    out: dict[str, Any] = {}
    lru, aware = summaries.get("hot-burst/lru"), summaries.get("hot-burst/cost_aware")
    if lru is not None and aware is not None:
        # WORKLOADS.md: the hot tenant "during and after the burst" (its cold start before the
        # sweep is the same for both policies), and over the whole run for reference.
        window = "from_burst_by_tenant"
        ratio = _ratio(
            _quantile(lru, "prio", groups=window), _quantile(aware, "prio", groups=window)
        )
        out["hot_burst_p99_ttft_lru_over_cost_aware"] = ratio
        for label, summary in (("lru", lru), ("cost_aware", aware)):
            out[f"hot_burst_hot_p99_ttft_ms_{label}"] = _quantile(summary, "prio", groups=window)
            out[f"hot_burst_hot_in_l0_ratio_{label}"] = _in_l0(summary, "prio", window)
            out[f"hot_burst_hot_p99_ttft_ms_whole_run_{label}"] = _quantile(summary, "prio")
            out[f"hot_burst_batch_p50_ttft_ms_{label}"] = _quantile(summary, "batch", "p50")
    storm, calm = summaries.get("cold-storm/storm"), summaries.get("cold-storm/no-storm")
    if storm is not None and calm is not None:
        ratio = _ratio(storm["warm_p99_ttft_ms"], calm["warm_p99_ttft_ms"])
        out["storm_warm_p99_ttft_ratio"] = ratio
        for label, summary in (("storm", storm), ("no_storm", calm)):
            out[f"storm_warm_p99_ttft_ms_{label}"] = summary["warm_p99_ttft_ms"]
    for name, summary in summaries.items():
        prefix = name.replace("-", "_").replace("/", "_")
        out[f"{prefix}_l0_hit_ratio"] = summary["hit_ratio"]["L0"]
        out[f"{prefix}_completed_ratio"] = _ratio(summary["completed"], summary["requests"])
    return out
