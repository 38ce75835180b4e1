"""``loraplex bench serve``'s summaries: per-run statistics from the request records and the
headline ratios from those. Undefined values (no data) are None, which the JSON line shows as
null, never 0.0: for a lower-is-better ratio, 0.0 would read as a perfect result. TTFT
percentiles count every request, a failed, shed or timed-out one at the client's timeout (a
run that sheds more must not look faster); TPOT is over completed requests only (a failed
stream has no per-token time), and the completed ratio stands beside every headline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from loraplex.bench.harness.stats import at_timeout
from loraplex.bench.harness.stats import ratio as _ratio
from loraplex.bench.serve.driver import TIERS, RequestRecord, ResidencyView
from loraplex.residency.stats import percentile

STEADY_TENANTS = ("steady-a", "steady-b")


@dataclass(frozen=True)
class RunResult:
    """One server run (or the pooled repeats of one): the records and the cache's view."""

    name: str  # e.g. "hot-burst@9/lru"
    records: tuple[RequestRecord, ...]  # one per trace request (of every repeat)
    residency: ResidencyView  # tiers at arrival, hit series, final cache stats
    timeout_s: float  # the client's bound on a request: a failed one counts as at least this
    burst_start_s: float | None = None  # hot-burst: when the batch sweep starts
    # The pooled run's repeats, each on its own (in run order; () when this is one repeat)
    repeats: tuple[RunResult, ...] = ()


def _ms(values: Sequence[float | None]) -> dict[str, float | None]:
    """Count and percentiles in ms; the percentiles of no values are None (null), never 0."""
    ordered = sorted(v * 1000 for v in values if v is not None)
    qs = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
    if not ordered:
        return {"n": 0, **{k: None for k in qs}}
    return {"n": len(ordered), **{k: round(percentile(ordered, q), 2) for k, q in qs.items()}}


def ttft_or_timeout(record: RequestRecord, timeout_s: float) -> float:
    """A completed request's TTFT; a failed, shed or timed-out one counts as at least the
    timeout (WORKLOADS.md), so a run that sheds more does not get a better percentile."""
    return at_timeout(record.ok, record.ttft_s, timeout_s)


def _group(records: Sequence[RequestRecord], timeout_s: float) -> dict[str, Any]:
    """TTFT over every request (failures at the timeout), TPOT over the completed ones (a
    failed stream has no per-token time), the completed share and the tiers at arrival."""
    done = [r for r in records if r.ok]
    return {
        "ttft_ms": _ms([ttft_or_timeout(r, timeout_s) for r in records]),
        "tpot_ms": _ms([r.tpot_s for r in done]),
        "completed": len(done),
        "completed_ratio": _ratio(len(done), len(records)),
        "tier_at_arrival": {t: sum(r.tier == t for r in records) for t in TIERS},
    }


def _grouped(
    records: Sequence[RequestRecord], group: Callable[[RequestRecord], str], timeout_s: float
) -> dict[str, dict[str, Any]]:
    keys = sorted({group(r) for r in records})
    return {key: _group([r for r in records if group(r) == key], timeout_s) for key in keys}


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
    records, timeout_s = run.records, run.timeout_s
    statuses: dict[str, int] = {}
    for r in records:
        label = str(r.status) if r.error is None or r.status != 200 else f"{r.status}-error"
        statuses[label] = statuses.get(label, 0) + 1
    stats = run.residency.final
    steady = [r for r in records if r.tenant in STEADY_TENANTS]
    warm = [r for r in steady if r.tier == "L0"]
    return {
        # NOTE: "warm" selects by tier at arrival, a population the storm itself changes;
        # steady_p99_ttft_ms (every steady request) does not depend on it.
        "warm_p99_ttft_ms": _ms([ttft_or_timeout(r, timeout_s) for r in warm])["p99"],
        "steady_p99_ttft_ms": _ms([ttft_or_timeout(r, timeout_s) for r in steady])["p99"],
        "steady_completed_ratio": _ratio(sum(r.ok for r in steady), len(steady)),
        "requests": len(records),
        "statuses": statuses,
        "hit_ratio": hit_ratios(stats),
        "thrash_ratio": _thrash(stats),
        **_group(records, timeout_s),
        "by_tier": _grouped(records, lambda r: r.tier, timeout_s),
        "by_tenant": _grouped(records, lambda r: r.tenant, timeout_s),
        **(
            {}
            if run.burst_start_s is None
            else {
                "from_burst_by_tenant": _grouped(
                    [r for r in records if r.t_s >= run.burst_start_s],
                    lambda r: r.tenant,
                    timeout_s,
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
    summary: dict[str, Any] | None, tenant: str, q: str = "p99", groups: str = "by_tenant"
) -> float | None:
    """A TTFT percentile (ms) of ``tenant``'s requests (failures at the timeout); None when the
    run is missing or the tenant sent nothing."""
    if summary is None:
        return None
    value = summary[groups].get(tenant, {}).get("ttft_ms", {}).get(q)
    return None if value is None else float(value)


def _completed(summary: dict[str, Any] | None, tenant: str, groups: str) -> float | None:
    """Share of ``tenant``'s requests that completed; None when it sent none."""
    if summary is None:
        return None
    group = summary[groups].get(tenant)
    return None if group is None else group["completed_ratio"]


def _in_l0(summary: dict[str, Any] | None, tenant: str, groups: str) -> float | None:
    """Share of ``tenant``'s requests whose adapter was in a GPU slot on arrival."""
    group = None if summary is None else summary[groups].get(tenant)
    if not group or not group["ttft_ms"]["n"]:
        return None
    return round(int(group["tier_at_arrival"]["L0"]) / int(group["ttft_ms"]["n"]), 4)


# The policies whose gain and price are reported against the two LRU baselines (the default
# of ServeBenchConfig.hot_burst_candidates, --hot-burst-candidates).
HOT_BURST_CANDIDATES = ("cost_aware", "admit_gdsf")
HOT_BURST_BASELINES = ("lru", "lru_priority")  # the gain and price are against these


def hot_burst_policies(
    candidates: tuple[str, ...] = HOT_BURST_CANDIDATES,
    baselines: tuple[str, ...] = HOT_BURST_BASELINES,
) -> tuple[str, ...]:
    """Every policy a hot-burst point runs: the baselines, then the candidates."""
    return baselines + candidates


_WINDOW = "from_burst_by_tenant"  # the hot tenant "during and after the burst" (WORKLOADS.md)


def hot_burst_run(slots: int, policy: str) -> str:
    """The run name of one hot-burst point."""
    return f"hot-burst@{slots}/{policy}"


def hot_burst_point(
    summaries: dict[str, dict[str, Any]],
    slots: int,
    candidates: tuple[str, ...] = HOT_BURST_CANDIDATES,
    baselines: tuple[str, ...] = HOT_BURST_BASELINES,
) -> dict[str, Any]:
    """One capacity point of hot-burst. The gain: the hot tenant's P99 TTFT from the burst on,
    under lru and under lru_priority (which sees tenant priority too; the ``baselines`` run)
    over each candidate (``candidates``). The price: the batch tenant's P50 TTFT, candidate
    over lru and over lru_priority. Completed ratios stand beside each (in this order in the
    JSON line and the report); missing runs give None."""
    policies = hot_burst_policies(candidates, baselines)
    sides = {p: summaries.get(hot_burst_run(slots, p)) for p in policies}
    hot = {p: _quantile(s, "prio", groups=_WINDOW) for p, s in sides.items()}
    batch = {p: _quantile(s, "batch", "p50") for p, s in sides.items()}
    out: dict[str, Any] = {}
    for new in candidates:
        for base in baselines:
            out[f"hot_burst_p99_ttft_{base}_over_{new}"] = _ratio(hot[base], hot[new])
    for p, s in sides.items():
        out[f"hot_burst_hot_completed_ratio_{p}"] = _completed(s, "prio", _WINDOW)
    for new in candidates:
        for base in baselines:
            out[f"hot_burst_batch_p50_ttft_{new}_over_{base}"] = _ratio(batch[new], batch[base])
    for p, s in sides.items():
        out[f"hot_burst_batch_completed_ratio_{p}"] = _completed(s, "batch", "by_tenant")
    for p, s in sides.items():
        out[f"hot_burst_hot_p99_ttft_ms_{p}"] = hot[p]
        out[f"hot_burst_hot_p50_ttft_ms_{p}"] = _quantile(s, "prio", "p50", _WINDOW)
        out[f"hot_burst_hot_in_l0_ratio_{p}"] = _in_l0(s, "prio", _WINDOW)
        out[f"hot_burst_hot_p99_ttft_ms_whole_run_{p}"] = _quantile(s, "prio")
        out[f"hot_burst_batch_p50_ttft_ms_{p}"] = batch[p]
        out[f"hot_burst_l0_hit_ratio_{p}"] = None if s is None else s["hit_ratio"]["L0"]
    return out


def headline(
    summaries: dict[str, dict[str, Any]],
    hot_burst_slots: tuple[int, ...] = (),
    candidates: tuple[str, ...] = HOT_BURST_CANDIDATES,
    baselines: tuple[str, ...] = HOT_BURST_BASELINES,
) -> dict[str, Any]:
    """The headline ratios, each followed by the completed ratios it depends on, then the
    numbers they come from. Hot-burst's flat keys are its first capacity point; every point
    is under ``hot_burst_sweep`` (slots -> that point's metrics)."""
    out: dict[str, Any] = {}
    if hot_burst_slots:
        points = {
            str(n): hot_burst_point(summaries, n, candidates, baselines) for n in hot_burst_slots
        }
        out.update(points[str(hot_burst_slots[0])])
        out["hot_burst_slots"] = hot_burst_slots[0]
        out["hot_burst_sweep"] = points
    storm, calm = summaries.get("cold-storm/storm"), summaries.get("cold-storm/no-storm")
    if storm is not None and calm is not None:
        # Warm: steady requests whose adapter was in L0 on arrival; steady: all of them.
        for kind in ("warm", "steady"):
            key = f"{kind}_p99_ttft_ms"
            out[f"storm_{kind}_p99_ttft_ratio"] = _ratio(storm[key], calm[key])
        out["storm_steady_completed_ratio_storm"] = storm["steady_completed_ratio"]
        out["storm_steady_completed_ratio_no_storm"] = calm["steady_completed_ratio"]
        for kind in ("warm", "steady"):
            for label, summary in (("storm", storm), ("no_storm", calm)):
                out[f"storm_{kind}_p99_ttft_ms_{label}"] = summary[f"{kind}_p99_ttft_ms"]
    for name, summary in summaries.items():
        prefix = name.replace("-", "_").replace("/", "_").replace("@", "_")
        out[f"{prefix}_l0_hit_ratio"] = summary["hit_ratio"]["L0"]
        out[f"{prefix}_completed_ratio"] = summary["completed_ratio"]
    return out
