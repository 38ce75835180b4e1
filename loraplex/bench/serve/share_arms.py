"""``bench serve --tier-share-by-priority both``: the tier-share rule as an arm of every
hot-burst cell, measured in one invocation.

Each hot-burst run (one policy at one slot count) becomes two, ``tier_share_by_priority`` off
and on, next to each other in their comparison group, so ``run_order`` (which reverses a group
every other repeat) runs them off-on, on-off, off-on, ...: ABBA per cell, both arms replaying
the same trace at the same rate (one capacity measurement) a run apart. Each arm keeps the
figures a plain run has (``headline``, ``hot_burst_spread``, under the plain run names), and
per slot count and policy the rule's effect is on / off of the hot tenant's P99 TTFT (from the
sweep on) and of the batch tenant's P50 TTFT: within a repeat (the same ABBA round), then
[median, min, max] over the repeats, and over the pooled repeats. An undefined ratio (a side
without data, a zero denominator) is None, never 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from loraplex.bench.harness.stats import median_min_max, ratio
from loraplex.bench.report import markdown_table, spread_cell
from loraplex.bench.serve.repeats import hot_burst_spread, repeat_points, spread_section
from loraplex.bench.serve.runs import Run
from loraplex.bench.serve.summary import RunResult, headline, hot_burst_policies, summarize

SHARE_SETTINGS = ("off", "on", "both")  # bench serve's --tier-share-by-priority
ARMS = ("off", "on")  # a cell's arms, in the order its first repeat runs them

# The figures whose on / off the JSON line reports: name -> hot_burst_point key (per policy)
_FIGURES = {
    "hot_p99_ttft": "hot_burst_hot_p99_ttft_ms_{}",
    "batch_p50_ttft": "hot_burst_batch_p50_ttft_ms_{}",
}


def check_share_setting(
    setting: str, scenarios: Sequence[str], trace_scenarios: Sequence[str]
) -> None:
    """Raises ValueError unless ``setting`` is one of ``SHARE_SETTINGS`` and, for "both", the
    trace scenarios (``trace_scenarios``) run are hot-burst alone: its runs are the arms."""
    if setting not in SHARE_SETTINGS:
        raise ValueError(
            f"tier_share_by_priority {setting!r} is invalid; expected one of {list(SHARE_SETTINGS)}"
        )
    others = sorted(set(trace_scenarios) - {"hot-burst"})
    if setting == "both" and ("hot-burst" not in scenarios or set(scenarios) & set(others)):
        raise ValueError(
            f"tier_share_by_priority 'both' is invalid with scenarios {list(scenarios)}; the "
            f"rule's arms are hot-burst runs: expected hot-burst, without {others} (run those "
            "with 'on' or 'off')"
        )


def arm_run(name: str, arm: str) -> str:
    """The run name of one arm of a run (``hot-burst@9/lru/by-priority-on``)."""
    return f"{name}/by-priority-{arm}"


def with_arms(group: list[Run]) -> list[Run]:
    """Each run of ``group`` as its two arms, side by side (off, then on)."""
    return [
        (arm_run(name, arm), workload, replace(options, tier_share_by_priority=arm == "on"))
        for name, workload, options in group
        for arm in ARMS
    ]


def arm_runs(runs: Sequence[RunResult], arm: str) -> list[RunResult]:
    """The runs of one arm, under their plain names (``hot-burst@9/lru``)."""
    suffix = arm_run("", arm)
    return [
        replace(run, name=run.name.removesuffix(suffix))
        for run in runs
        if run.name.endswith(suffix)
    ]


def share_arm_metrics(
    runs: Sequence[RunResult],
    slots: tuple[int, ...],
    candidates: tuple[str, ...],
    baselines: tuple[str, ...],
) -> dict[str, Any]:
    """The JSON line's keys of a ``both`` run: the rule's effect per slot count and policy
    (``tier_share_by_priority_on_over_off``), then every arm's own hot-burst figures
    (``tier_share_by_priority_arms``: ``headline``'s keys and ``hot_burst_repeats``)."""
    arms: dict[str, dict[str, Any]] = {}
    for arm in ARMS:
        members = arm_runs(runs, arm)
        summaries = {run.name: summarize(run) for run in members}
        arms[arm] = headline(summaries, slots, candidates, baselines)
        arms[arm]["hot_burst_repeats"] = hot_burst_spread(members, slots, candidates, baselines)
    effect: dict[str, dict[str, dict[str, Any]]] = {}
    for count in slots:
        points = {arm: repeat_points(arm_runs(runs, arm), count, candidates, baselines)
                  for arm in ARMS}  # fmt: skip
        pooled = {arm: arms[arm]["hot_burst_sweep"][str(count)] for arm in ARMS}
        effect[str(count)] = {
            policy: _on_over_off(points, pooled, policy)
            for policy in hot_burst_policies(candidates, baselines)
        }
    return {"tier_share_by_priority_on_over_off": effect, "tier_share_by_priority_arms": arms}


def _on_over_off(
    points: dict[str, list[dict[str, Any]]], pooled: dict[str, dict[str, Any]], policy: str
) -> dict[str, Any]:
    """One cell's on / off figures: per repeat i (arm on's repeat i over arm off's) as
    [median, min, max], and over the pooled repeats."""
    out: dict[str, Any] = {}
    for name, template in _FIGURES.items():
        key = template.format(policy)
        per_repeat = [
            ratio(on[key], off[key]) for on, off in zip(points["on"], points["off"], strict=True)
        ]
        out[f"{name}_on_over_off"] = median_min_max(per_repeat) if per_repeat else None
        out[f"{name}_on_over_off_pooled"] = ratio(pooled["on"][key], pooled["off"][key])
    return out


_COLUMNS = ["slots", "policy", *(f"{n}_on_over_off{s}" for n in _FIGURES for s in ("", "_pooled"))]


def arms_section(
    metrics: dict[str, Any], candidates: tuple[str, ...], baselines: tuple[str, ...], repeats: int
) -> list[str]:
    """The report's tables of a ``both`` run (none otherwise): the rule's effect, then each
    arm's per-repeat table."""
    effect = metrics.get("tier_share_by_priority_on_over_off")
    if not effect:
        return []
    rows = [
        {
            "slots": slots,
            "policy": policy,
            **{
                column: value if column.endswith("_pooled") else spread_cell(value)
                for column, value in figures.items()
            },
        }
        for slots, cell in effect.items()
        for policy, figures in cell.items()
    ]
    parts = [
        "## tier_share_by_priority on / off per hot-burst cell (hot: the prio tenant's P99 TTFT "
        f"from the sweep on; batch: its P50 TTFT; median [min-max] over {repeats} repeats, "
        "each ratio within one ABBA round; pooled: over every repeat's requests)",
        markdown_table(rows, _COLUMNS),
    ]
    for arm, arm_metrics in metrics["tier_share_by_priority_arms"].items():
        label = f" (tier_share_by_priority {arm})"
        parts += spread_section(arm_metrics, candidates, repeats, baselines, label)
    return parts
