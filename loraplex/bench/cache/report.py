"""Markdown and PNG output of the cache benchmark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loraplex.bench.report import markdown_table


def cache_markdown(result: dict[str, Any], plot_name: str | None) -> str:
    parts = [
        "## Run",
        f"config: `{result['config']}`, seed {result['seed']}",
        "## Headline metrics",
        markdown_table(
            [{"metric": k, "value": v} for k, v in sorted(result["metrics"].items())],
            ["metric", "value"],
        ),
        "## Load latency into L0 by source tier (ms), next to raw costs of the same bytes",
        "l3/l2/l1: the cache's load from that tier, acquire to lease in hand; raw: sha256 + "
        "safetensors read (tensors touched); copy: a plain tensor copy into buffers allocated "
        "and touched before timing; peft: PeftModel.load_adapter. One clock (perf_counter) "
        "around each whole call.",
    ]
    rows = []
    for preset, columns in result["latency"].items():
        for column, q in columns.items():
            rows.append(
                {"preset": preset, "variant": column, **{k: round(v, 3) for k, v in q.items()}}
            )
    parts.append(markdown_table(rows, ["preset", "variant", "p50_ms", "p95_ms", "p99_ms"]))
    parts.append(
        "## Trace replays (cache only; tier costs measured above), identical capacities; "
        "tenant priorities prio 4, batch 0.25; batch_p50_wait: the batch tenant's median "
        "seconds from arrival to lease (simulated)"
    )
    replay_rows = []
    for scenario, policies in result["replays"].items():
        for policy, row in policies.items():
            prio = row["tenant_l0_hit_ratio"].get("prio", {})
            replay_rows.append(
                {
                    "scenario": scenario,
                    "policy": policy,
                    **{f"hit_{k}": v for k, v in row["hit_ratio"].items()},
                    "reloads": sum(row["reloads_after_eviction"].values()),
                    "thrash": row["thrash_ratio"],
                    "hot_l0_during": prio.get("during", ""),
                    "hot_l0_after": prio.get("after", ""),
                    "batch_p50_wait": row["tenant_wait_s"].get("batch", {}).get("p50", ""),
                }
            )
    columns = [
        "scenario",
        "policy",
        "hit_L0",
        "hit_L1",
        "hit_L2",
        "hit_L3",
        "reloads",
        "thrash",
        "hot_l0_during",
        "hot_l0_after",
        "batch_p50_wait",
    ]
    parts.append(markdown_table(replay_rows, columns))
    if plot_name:
        parts.append(f"![L0 hit ratio over time]({plot_name})")
    return "\n\n".join(parts) + "\n"


def cache_plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(result["replays"])
    fig, axes = plt.subplots(1, len(scenarios), figsize=(5 * len(scenarios), 3.5), squeeze=False)
    for ax, scenario in zip(axes[0], scenarios, strict=True):
        for policy, row in result["replays"][scenario].items():
            times = [t for t, _ in row["timeline"]]
            ratios = [float("nan") if h is None else h for _, h in row["timeline"]]  # no requests
            ax.plot(times, ratios, label=policy)
        ax.set_title(scenario)
        ax.set_xlabel("trace time (s)")
        ax.set_ylabel("L0 hit ratio")
        ax.set_ylim(0, 1.05)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
