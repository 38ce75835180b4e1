"""The ``bench modes`` plot: decode tokens/s per mode against the hot revision's token share,
and merged / unmerged against the per-token bound (``bench.gain_bound``)."""

from __future__ import annotations

from pathlib import Path

from loraplex.bench.modes.decisions import gain_bound


def modes_plot(result: dict[str, object], path: Path) -> None:
    """Writes the two panels to ``path`` (PNG) from one ``run_modes_bench`` result."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = result["metrics"]
    if not isinstance(metrics, dict) or not isinstance(metrics.get("share_sweep"), list):
        raise ValueError("result has no share_sweep; expected run_modes_bench output")
    rows = sorted(metrics["share_sweep"], key=lambda r: float(r["hot_share"]))
    shares = [float(r["hot_share"]) for r in rows]
    overhead = metrics.get("unmerged_lora_overhead")
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for mode in ("unmerged", "merged"):
        left.plot(shares, [float(r[mode]) for r in rows], marker="o", label=mode)
    left.set_xlabel("hot revision's share of the step's tokens")
    left.set_ylabel("decode tokens/s")
    left.legend()
    measured = [r["merged_over_unmerged"] for r in rows]
    right.plot(shares, [float(m) if m is not None else float("nan") for m in measured],
               marker="o", label="merged / unmerged (measured)")  # fmt: skip
    bound = [gain_bound(s, overhead if isinstance(overhead, float) else None) for s in shares]
    right.plot(shares, [b if b is not None else float("nan") for b in bound], linestyle="--",
               label=f"per-token bound (overhead {overhead:.2f})" if isinstance(overhead, float)
               else "per-token bound")  # fmt: skip
    right.axhline(1.0, color="grey", linewidth=0.8)
    right.set_xlabel("hot revision's share of the step's tokens")
    right.legend()
    config = result.get("config")
    if not isinstance(config, dict):
        config = {}
    batch, dtype = config.get("batch_size"), config.get("dtype")
    fig.suptitle(f"bench modes: {batch} sequences per decode step, {dtype}, 16 adapters")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
