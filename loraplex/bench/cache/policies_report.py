"""Markdown and PNG output of ``loraplex bench residency`` (``bench/cache/policies.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loraplex.bench.report import markdown_table
from loraplex.bench.report import spread_cell as _cell

_COLUMNS = (
    "hit_l0",
    "hit_l0_l1",
    "hit_l1_local",
    "hit_l0_l2",
    "reloads_per_1k_l0",
    "reloads_per_1k_l1",
    "reloads_per_1k_l2",
    "reloads_per_1k",
    "fills_per_1k_l1",
    "fills_per_1k_l2",
    "wait_p99_s_prio",
    "wait_p50_s_batch",
    "drift_recovery_share",
)


def policies_markdown(result: dict[str, Any], plot_names: tuple[str, str] | None) -> str:
    parts = [
        "## Run",
        f"config: `{result['config']}`, seeds {result['seed']}",
        "## Headline (medians over seeds; each new policy against lru, and the floors)",
        markdown_table(
            [{"metric": k, "value": v} for k, v in result["metrics"].items()], ["metric", "value"]
        ),
        "## Per trace and policy: median [min-max] over seeds",
    ]
    rows = []
    for trace, policies in result["traces"].items():
        for policy, metrics in policies.items():
            present = {c: _cell(metrics[c]) for c in _COLUMNS if c in metrics}
            rows.append({"trace": trace, "policy": policy, **present})
    parts.append(markdown_table(rows, ["trace", "policy", *_COLUMNS]))
    if plot_names:
        parts.append(f"![L0 hit ratio over time]({plot_names[0]})")
        parts.append(f"![wait CDF per tenant]({plot_names[1]})")
    return "\n\n".join(parts) + "\n"


def policies_plots(result: dict[str, Any], hit_path: Path, cdf_path: Path) -> None:
    """L0 hit ratio over time per policy (seed 0, every trace) and, for hot-burst, the CDF of
    each tenant's wait for its lease per policy (seed 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = list(result["timelines"])
    fig, axes = plt.subplots(2, (len(traces) + 1) // 2, figsize=(15, 7), squeeze=False)
    for ax, trace in zip(axes.flat, traces, strict=False):
        for policy, timeline in result["timelines"][trace].items():
            times = [t for t, _ in timeline]
            ratios = [float("nan") if h is None else h for _, h in timeline]
            ax.plot(times, ratios, label=policy, linewidth=1)
        ax.set_title(trace)
        ax.set_xlabel("trace time (s)")
        ax.set_ylabel("L0 hit ratio")
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(hit_path, dpi=90)
    plt.close(fig)
    cdfs = result.get("wait_cdfs", {})
    fig, axes = plt.subplots(1, max(1, len(cdfs)), figsize=(6 * max(1, len(cdfs)), 3.5))
    for ax, (tenant, policies) in zip(
        [axes] if len(cdfs) <= 1 else axes, cdfs.items(), strict=False
    ):
        for policy, waits in policies.items():
            ys = [(i + 1) / len(waits) for i in range(len(waits))]
            ax.step([1000 * w for w in waits], ys, label=policy, where="post")
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_title(f"hot-burst@9: {tenant} wait for its lease (CDF)")
        ax.set_xlabel("ms (simulated)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(cdf_path, dpi=90)
    plt.close(fig)
