"""Hot-burst figures per repeat, as median [min-max] over the repeats of ``bench serve``.

The pooled runs (``serve_runs``) mix every repeat's records into one percentile, which hides
how far the repeats disagree. Here each repeat is summarized on its own, its capacity point
computed as ``hot_burst_point`` computes the pooled one (repeat i of every policy: the same
ABBA round), and every figure, ratios included, becomes [median, min, max] over the repeats.
A ratio is taken within a repeat (lru's repeat i over the candidate's repeat i), then spread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loraplex.bench.harness.stats import median_min_max
from loraplex.bench.report import markdown_table, spread_cell
from loraplex.bench.serve.summary import (
    HOT_BURST_BASELINES,
    RunResult,
    hot_burst_point,
    hot_burst_policies,
    hot_burst_run,
    summarize,
    ttft_or_timeout,
)

Spread = dict[str, list[float] | None]  # metric key of hot_burst_point -> [median, min, max]


def hot_burst_spread(
    runs: Sequence[RunResult],
    slots: Sequence[int],
    candidates: tuple[str, ...],
    baselines: tuple[str, ...] = HOT_BURST_BASELINES,
) -> dict[str, Spread]:
    """slots -> every figure of that capacity point as [median, min, max] over the repeats
    (None where a repeat had it undefined). A slot count without runs is left out."""
    out: dict[str, Spread] = {}
    for count in slots:
        points = repeat_points(runs, count, candidates, baselines)
        if points:
            out[str(count)] = {key: median_min_max([p[key] for p in points]) for key in points[0]}
    return out


def repeat_points(
    runs: Sequence[RunResult],
    slots: int,
    candidates: tuple[str, ...],
    baselines: tuple[str, ...] = HOT_BURST_BASELINES,
) -> list[dict[str, Any]]:
    """The capacity point at ``slots`` computed on each repeat alone (``hot_burst_point``),
    repeat i of every policy together (the same ABBA round); [] without runs."""
    by_name = {run.name: run for run in runs}
    names = [hot_burst_run(slots, p) for p in hot_burst_policies(candidates, baselines)]
    members = [by_name[n] for n in names if n in by_name]
    repeats = min((len(m.repeats) for m in members), default=0)
    return [
        hot_burst_point(
            {m.name: summarize(m.repeats[i]) for m in members}, slots, candidates, baselines
        )
        for i in range(repeats)
    ]


# The two tenants of hot-burst as the TTFT CDF shows them (tenant_ttft_ms's keys)
TENANT_LABELS = {"prio": "hot tenant (prio), from the sweep on", "batch": "batch tenant"}


def tenant_ttft_ms(
    runs: Sequence[RunResult],
    slots: Sequence[int],
    candidates: tuple[str, ...],
    baselines: tuple[str, ...] = HOT_BURST_BASELINES,
) -> dict[int, dict[str, dict[str, list[float]]]]:
    """slots -> tenant -> policy -> sorted TTFT (ms) over every repeat's requests, a failed one
    at the timeout: the hot tenant's from the sweep on (the headline's window), the batch
    tenant's all. Slot counts without a hot-burst run are left out."""
    by_name = {run.name: run for run in runs}
    out: dict[int, dict[str, dict[str, list[float]]]] = {}
    for count in slots:
        point: dict[str, dict[str, list[float]]] = {tenant: {} for tenant in TENANT_LABELS}
        for policy in hot_burst_policies(candidates, baselines):
            run = by_name.get(hot_burst_run(count, policy))
            if run is None:
                continue
            start = run.burst_start_s if run.burst_start_s is not None else 0.0
            for tenant, values in point.items():
                values[policy] = sorted(
                    ttft_or_timeout(r, run.timeout_s) * 1000
                    for r in run.records
                    if r.tenant == tenant and (tenant != "prio" or r.t_s >= start)
                )
        if any(point.values()):
            out[count] = point
    return out


SPREAD_COLUMNS = [
    "slots",
    "policy",
    "hot_p99_ms",
    "hot_p50_ms",
    "batch_p50_ms",
    "l0_hit",
    "hot_in_l0",
    "lru_over_policy_hot_p99",
    "lru_priority_over_policy_hot_p99",
    "batch_p50_over_lru",
    "hot_completed",
    "batch_completed",
]


def spread_rows(
    spread: dict[str, Spread],
    candidates: tuple[str, ...],
    baselines: tuple[str, ...] = HOT_BURST_BASELINES,
) -> list[dict[str, object]]:
    """One row per slot count and policy; the gain and price columns only for candidates."""
    rows: list[dict[str, object]] = []
    for slots, m in spread.items():
        for p in hot_burst_policies(candidates, baselines):
            keys = {
                "hot_p99_ms": f"hot_burst_hot_p99_ttft_ms_{p}",
                "hot_p50_ms": f"hot_burst_hot_p50_ttft_ms_{p}",
                "batch_p50_ms": f"hot_burst_batch_p50_ttft_ms_{p}",
                "l0_hit": f"hot_burst_l0_hit_ratio_{p}",
                "hot_in_l0": f"hot_burst_hot_in_l0_ratio_{p}",
                "hot_completed": f"hot_burst_hot_completed_ratio_{p}",
                "batch_completed": f"hot_burst_batch_completed_ratio_{p}",
            }
            if p not in baselines:  # a baseline not run leaves its column empty
                for base in baselines:
                    keys[f"{base}_over_policy_hot_p99"] = f"hot_burst_p99_ttft_{base}_over_{p}"
                if "lru" in baselines:
                    keys["batch_p50_over_lru"] = f"hot_burst_batch_p50_ttft_{p}_over_lru"
            row: dict[str, object] = {"slots": slots, "policy": p}
            row.update({column: spread_cell(m.get(key)) for column, key in keys.items()})
            rows.append(row)
    return rows


def spread_section(
    metrics: dict[str, Any],
    candidates: tuple[str, ...],
    repeats: int,
    baselines: tuple[str, ...] = HOT_BURST_BASELINES,
    label: str = "",
) -> list[str]:
    """The report's per-repeat table (none when the run had no hot-burst); ``label`` names the
    arm it belongs to (``share_arms``)."""
    spread = metrics.get("hot_burst_repeats")
    if not spread:
        return []
    return [
        f"## Hot-burst per repeat{label}: median [min-max] over {repeats} repeats (TTFT ms; hot: "
        "the prio tenant from the sweep on; ratios within a repeat, then spread)",
        markdown_table(spread_rows(spread, candidates, baselines), SPREAD_COLUMNS),
    ]
