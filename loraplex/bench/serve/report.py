"""Markdown and PNG output of ``loraplex bench serve``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loraplex.bench.report import markdown_table
from loraplex.bench.serve.driver import TIERS
from loraplex.bench.serve.repeats import TENANT_LABELS, spread_section, tenant_ttft_ms
from loraplex.bench.serve.share_arms import arms_section
from loraplex.bench.serve.summary import (
    HOT_BURST_BASELINES,
    HOT_BURST_CANDIDATES,
    RunResult,
    hot_burst_policies,
    ttft_or_timeout,
)

_SCALARS = (int, float, str, type(None))  # None: undefined (no data), shown as such


def serve_json_line(result: dict[str, Any]) -> str:
    return json.dumps({k: result[k] for k in ("name", "config", "seed", "metrics")})


def serve_markdown(
    result: dict[str, Any],
    cdf_png: str,
    hits_png: str,
    tenant_cdf_png: str | None = None,
    arm_cdf_pngs: dict[str, str] | None = None,
) -> str:
    """The report page; ``arm_cdf_pngs``: each share arm's tenant CDF (``share_arms``)."""
    metrics = result["metrics"]
    config = result["config"]
    candidates = tuple(config.get("hot_burst_candidates", HOT_BURST_CANDIDATES))
    baselines = tuple(config.get("hot_burst_baselines", HOT_BURST_BASELINES))
    repeats = int(config.get("trace_repeats", 1))
    # In the JSON line's order: each headline ratio with its completed ratios right after it.
    headline = [{"metric": k, "value": v} for k, v in metrics.items() if isinstance(v, _SCALARS)]
    parts = [
        "## Run",
        f"config: `{result['config']}`, seed {result['seed']}",
        "## Headline metrics",
        markdown_table(headline, ["metric", "value"]),
        *_sweep_section(metrics.get("hot_burst_sweep", {}), candidates, baselines),
        *spread_section(metrics, candidates, repeats, baselines),
        *arms_section(metrics, candidates, baselines, repeats),
        "## Runs (TTFT in ms over every request, failed ones at the timeout; TPOT over "
        "completed requests; tier = adapter's tier at arrival)",
        markdown_table(_run_rows(metrics["runs"]), _RUN_COLUMNS),
        "## TTFT by tier at arrival (ms)",
        markdown_table(_group_rows(metrics["runs"], "by_tier"), _GROUP_COLUMNS),
        "## TTFT and TPOT by tenant (ms)",
        markdown_table(_group_rows(metrics["runs"], "by_tenant"), _GROUP_COLUMNS),
        *_kind_section(metrics.get("adversarial_kinds", {})),
        f"![TTFT CDF per tier]({cdf_png})",
        *(
            []
            if tenant_cdf_png is None
            else [f"![hot-burst TTFT CDF per tenant]({tenant_cdf_png})"]
        ),
        *(
            f"![hot-burst TTFT CDF per tenant, tier_share_by_priority {arm}]({png})"
            for arm, png in (arm_cdf_pngs or {}).items()
        ),
        f"![L0 hit ratio over time]({hits_png})",
        "## JSON line",
        "```json\n" + serve_json_line(result) + "\n```",
    ]
    return "\n\n".join(parts) + "\n"


def _sweep_keys(candidates: tuple[str, ...], baselines: tuple[str, ...]) -> dict[str, str]:
    """Report column -> metric key of one hot-burst point (gain, price, then completed ratios)."""
    policies = hot_burst_policies(candidates, baselines)
    return {
        **{
            f"gain_{b}_over_{n}": f"hot_burst_p99_ttft_{b}_over_{n}"
            for n in candidates
            for b in baselines
        },
        **{
            f"price_{n}_over_{b}": f"hot_burst_batch_p50_ttft_{n}_over_{b}"
            for n in candidates
            for b in baselines
        },
        **{f"hot_completed_{p}": f"hot_burst_hot_completed_ratio_{p}" for p in policies},
        **{f"batch_completed_{p}": f"hot_burst_batch_completed_ratio_{p}" for p in policies},
    }


def _sweep_section(
    sweep: dict[str, dict[str, Any]], candidates: tuple[str, ...], baselines: tuple[str, ...]
) -> list[str]:
    """The capacity sweep's table; none without plain hot-burst runs (a ``both`` run has its
    arms' tables instead, ``share_arms``)."""
    if not sweep:
        return []
    keys = _sweep_keys(candidates, baselines)
    rows = [
        {"slots": slots, **{column: m.get(key) for column, key in keys.items()}}
        for slots, m in sweep.items()
    ]
    return [
        "## Hot-burst capacity sweep (gain: hot tenant P99 TTFT from the burst on, baseline "
        "over candidate; price: batch tenant P50 TTFT, candidate over baseline)",
        markdown_table(rows, ["slots", *keys]),
    ]


_KIND_COLUMNS = [
    "kind",
    "met",
    "victim_failed",
    "victim_p99_ttft_ratio",
    "victim_p99_ttft_ms_attacked",
    "victim_p99_ttft_ms_calm",
    "victim_503",
    "victim_503_max_ms",
    "server_rss_growth_mib_over_calm",
]


def _kind_section(kinds: dict[str, dict[str, Any]]) -> list[str]:
    """Issue 25's attacker kinds, one row each (none when the run had none)."""
    if not kinds:
        return []
    rows = [{"kind": kind, **{c: e[c] for c in _KIND_COLUMNS[1:]}} for kind, e in kinds.items()]
    return [
        "## Attacker kinds, each against its own calm run (victims' figures; targets: 0 failed, "
        "P99 ratio <= 1.5, hung-engine 503s <= 1 s, stuck-stream RSS growth over calm <= 16 MiB)",
        markdown_table(rows, _KIND_COLUMNS),
    ]


_RUN_COLUMNS = [
    "run",
    "requests",
    "completed",
    "statuses",
    "arrival_L0",
    "arrival_L3",
    "hit_L0",
    "hit_L1",
    "hit_L2",
    "hit_L3",
    "thrash",
    "ttft_p50",
    "ttft_p99",
]
_GROUP_COLUMNS = [
    "run",
    "group",
    "n",
    "completed",
    "in_L0",
    "ttft_p50",
    "ttft_p90",
    "ttft_p99",
    "tpot_p50",
    "tpot_p99",
]


def _run_rows(runs: dict[str, dict[str, Any]]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for name, s in runs.items():
        rows.append(
            {
                "run": name,
                "requests": s["requests"],
                "completed": s["completed"],
                "statuses": " ".join(f"{k}:{v}" for k, v in sorted(s["statuses"].items())),
                "arrival_L0": s["tier_at_arrival"]["L0"],
                "arrival_L3": s["tier_at_arrival"]["L3"],
                **{f"hit_{t}": s["hit_ratio"][t] for t in TIERS},
                "thrash": s["thrash_ratio"],
                "ttft_p50": s["ttft_ms"]["p50"],
                "ttft_p99": s["ttft_ms"]["p99"],
            }
        )
    return rows


def _group_rows(runs: dict[str, dict[str, Any]], key: str) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for name, s in runs.items():
        for group, q in s[key].items():
            ttft, tpot = q["ttft_ms"], q["tpot_ms"]
            rows.append(
                {
                    "run": name,
                    "group": group,
                    "n": ttft["n"],
                    "completed": q["completed"],
                    "in_L0": q["tier_at_arrival"]["L0"],
                    "ttft_p50": ttft["p50"],
                    "ttft_p90": ttft["p90"],
                    "ttft_p99": ttft["p99"],
                    "tpot_p50": tpot["p50"],
                    "tpot_p99": tpot["p99"],
                }
            )
    return rows


def ttft_cdf_plot(runs: list[RunResult], path: Path) -> None:
    """One panel per run: the TTFT CDF of every request (a failed one at the timeout), one
    line per tier at arrival."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    cols = 3
    rows = max(1, (len(runs) + cols - 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.5 * rows), squeeze=False)
    for ax, run in zip(axes.flat, runs, strict=False):
        for tier in TIERS:
            values = [ttft_or_timeout(r, run.timeout_s) for r in run.records if r.tier == tier]
            _cdf(ax, sorted(v * 1000 for v in values), tier, f"C{TIERS.index(tier)}")
        _cdf_axes(ax, run.name, NullFormatter())
    for ax in axes.flat[len(runs) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _cdf(ax: Any, values: list[float], label: str, color: str) -> None:
    """A step line: the CDF of the sorted ``values``."""
    if values:
        ys = [(i + 1) / len(values) for i in range(len(values))]
        ax.step(values, ys, where="post", label=f"{label} (n={len(values)})", color=color)


def _cdf_axes(ax: Any, title: str, minor: Any) -> None:
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(minor)
    ax.set_title(title)
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("fraction")
    ax.legend(fontsize="small")


def hot_burst_tenant_cdf_plot(
    runs: list[RunResult],
    slots: tuple[int, ...],
    candidates: tuple[str, ...],
    path: Path,
    baselines: tuple[str, ...] = HOT_BURST_BASELINES,
) -> bool:
    """hot-burst's TTFT CDF per tenant (``tenant_ttft_ms``): a row per slot count, the hot
    tenant left and the batch tenant right, a line per policy. False (nothing written) when
    no hot-burst run is there."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    series = tenant_ttft_ms(runs, slots, candidates, baselines)
    if not series:
        return False
    fig, axes = plt.subplots(len(series), 2, figsize=(12, 4 * len(series)), squeeze=False)
    for row, (count, tenants) in zip(axes, series.items(), strict=True):
        for ax, (tenant, by_policy) in zip(row, tenants.items(), strict=True):
            for index, (policy, values) in enumerate(by_policy.items()):
                _cdf(ax, values, policy, f"C{index}")
            _cdf_axes(ax, f"hot-burst@{count}: {TENANT_LABELS[tenant]}", NullFormatter())
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def hit_ratio_lines(run: RunResult, window: int) -> list[tuple[list[float], list[float]]]:
    """L0 hit ratio over time, one (seconds, ratio) line per repeat of ``run`` (the run itself
    when it has none): acquires in each sliding window of ``window`` residency polls."""
    lines = []
    for repeat in run.repeats or (run,):
        series = repeat.residency.hit_series
        xs, ys = [], []
        for (_, before), (t_s, after) in zip(series, series[window:], strict=False):
            total = sum(after.values()) - sum(before.values())
            if total > 0:
                xs.append(t_s)
                ys.append((after.get("L0", 0) - before.get("L0", 0)) / total)
        lines.append((xs, ys))
    return lines


def hit_ratio_plot(runs: list[RunResult], path: Path, window: int = 10) -> None:
    """L0 hit ratio over time per run, every repeat a line in the run's colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    for index, run in enumerate(runs):
        lines = hit_ratio_lines(run, window)
        label = run.name if len(lines) == 1 else f"{run.name} ({len(lines)} repeats)"
        for xs, ys in (line for line in lines if line[0]):
            ax.plot(xs, ys, color=f"C{index % 10}", alpha=0.8, linewidth=1, label=label)
            label = "_"  # the legend names each run once
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel("L0 hit ratio (sliding window)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
