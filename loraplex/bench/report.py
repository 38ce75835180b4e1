"""Markdown and PNG output for benchmark results (the JSON line is printed by the CLI)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def markdown_table(rows: Sequence[dict[str, object]], columns: Sequence[str]) -> str:
    """A GitHub table of ``columns`` (missing cells empty)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)


def _cell(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def spread_cell(value: list[float] | None) -> str:
    """median [min-max] of repeated measurements (seeds or repeats); 'null' when undefined."""
    if value is None:
        return "null"
    median, low, high = value
    return f"{median:g} [{low:g}-{high:g}]"


def execution_markdown(result: dict[str, object], plot_name: str | None) -> str:
    """The execution benchmark's report: headline metrics, per-variant rows, the matrix."""
    metrics = result["metrics"]
    rows = result["rows"]
    if not isinstance(metrics, dict) or not isinstance(rows, list):
        raise ValueError("result is missing metrics/rows; expected run_execution_bench output")
    headline = [r for r in rows if r.get("section") == "headline"]
    matrix = [r for r in rows if r.get("section") == "matrix"]
    parts = [
        "## Run",
        f"config: `{result['config']}`, seed {result['seed']}",
        "## Headline metrics",
        markdown_table(
            [{"metric": k, "value": v} for k, v in sorted(metrics.items())], ["metric", "value"]
        ),
        "## Headline variants (batch 16, 16 distinct S2 adapters on q/k/v/o)",
        markdown_table(headline, ["dtype", "step", "variant", "tokens_per_s", "over_base"]),
    ]
    if matrix:
        parts += [
            "## Qualification matrix (float32; one axis varied around the defaults)",
            markdown_table(
                matrix,
                [
                    "step",
                    "active",
                    "mix",
                    "popularity",
                    "batch_size",
                    "distinct_in_batch",
                    "variant",
                    "tokens_per_s",
                    "over_base",
                    "bytes_floor",
                ],
            ),
        ]
    if plot_name:
        parts.append(f"![mixed over base]({plot_name})")
    return "\n\n".join(parts) + "\n"


def execution_plot(result: dict[str, object], path: Path) -> None:
    """Bars of tokens/s over base per headline variant and dtype (decode)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    if not isinstance(rows, list):
        raise ValueError("result has no rows; expected run_execution_bench output")
    decode = [r for r in rows if r.get("section") == "headline" and r.get("step") == "decode"]
    dtypes = sorted({str(r["dtype"]) for r in decode})
    variants = list(dict.fromkeys(str(r["variant"]) for r in decode))
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / max(len(dtypes), 1)
    for i, dtype in enumerate(dtypes):
        values = {
            str(r["variant"]): float(str(r["over_base"])) for r in decode if r["dtype"] == dtype
        }
        xs = [j + i * width for j in range(len(variants))]
        ax.bar(xs, [values.get(v, 0.0) for v in variants], width, label=dtype)
    floor = result["metrics"].get("bytes_floor") if isinstance(result["metrics"], dict) else None
    if isinstance(floor, float):
        ax.axhline(floor, color="grey", linestyle="--", label="bytes-moved floor")
    ax.set_xticks(
        [j + width * (len(dtypes) - 1) / 2 for j in range(len(variants))],
        variants,
        rotation=30,
        ha="right",
    )
    ax.set_ylabel("decode tokens/s over loraplex base")
    ax.set_title("batch 16, 16 distinct S2 adapters")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
