"""The planner's pictures (issue 30): hit ratio vs CPU budget per eviction policy, TTFT CDF per
configuration, and cost per correct request vs replicas. PNG files; matplotlib's Agg backend."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loraplex.plan.select import Evaluation, Plan

TTFT_SAMPLES_KEY = "ttft_samples_ms"  # optional outcome key: every request's TTFT in ms
_MAX_CDF_LINES = 8  # the CDF plot shows the best few configurations, or it is unreadable


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def hit_ratio_vs_cpu(evaluations: Sequence[Evaluation], path: Path) -> None:
    """Mean L0 + L1 hit ratio (an acquire that did not go to disk or the store) per CPU budget,
    one line per eviction policy, over every candidate."""
    series: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for e in evaluations:
        hits = e.outcome["hit_ratio"]
        if hits["L0"] is None or hits["L1"] is None:
            continue
        bucket = series[e.candidate.eviction_policy][e.candidate.cpu_adapter_bytes]
        bucket.append(float(hits["L0"]) + float(hits["L1"]))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for policy, points in sorted(series.items()):
        xs = sorted(points)
        ax.plot(
            [x / (1 << 20) for x in xs],
            [sum(points[x]) / len(points[x]) for x in xs],
            "o-",
            label=policy,
        )
    ax.set_xlabel("CPU adapter budget per replica (MiB)")
    ax.set_ylabel("L0 + L1 hit ratio (mean over candidates)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def ttft_cdf(result: Plan, path: Path) -> bool:
    """TTFT CDF of the best configurations; False (no file) when the outcomes carry no
    per-request samples."""
    ranked = [e for e in (result.best, result.runner_up) if e is not None]
    ranked += [e for e in result.evaluations if e.feasible and e not in ranked]
    shown = [e for e in ranked if TTFT_SAMPLES_KEY in e.outcome][:_MAX_CDF_LINES]
    if not shown:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for e in shown:
        values = sorted(float(v) for v in e.outcome[TTFT_SAMPLES_KEY])
        if values:
            ys = [(i + 1) / len(values) for i in range(len(values))]
            ax.plot(values, ys, label=e.candidate.label())
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("share of requests")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def cost_vs_replicas(evaluations: Sequence[Evaluation], path: Path) -> None:
    """The cheapest cost per correct request at each replica count, feasible and not."""
    best: dict[bool, dict[int, float]] = {True: {}, False: {}}
    for e in evaluations:
        if e.usd_per_correct is None:
            continue
        side = best[e.feasible]
        replicas = e.candidate.replicas
        side[replicas] = min(side.get(replicas, e.usd_per_correct), e.usd_per_correct)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for feasible, label, style in ((True, "meets objectives", "o-"), (False, "misses", "x--")):
        xs = sorted(best[feasible])
        if xs:
            ax.plot(xs, [best[feasible][x] for x in xs], style, label=label)
    ax.set_xticks(sorted({*best[True], *best[False]}))
    ax.set_xlabel("replicas")
    ax.set_ylabel("USD per correct request (cheapest candidate)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_plots(result: Plan, directory: Path) -> list[Path]:
    """Every plot into ``directory``; the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = [directory / "plan-hit-ratio-vs-cpu.png", directory / "plan-cost-vs-replicas.png"]
    hit_ratio_vs_cpu(result.evaluations, written[0])
    cost_vs_replicas(result.evaluations, written[1])
    cdf = directory / "plan-ttft-cdf.png"
    if ttft_cdf(result, cdf):
        written.append(cdf)
    return written
