"""Markdown tables of ``sweep.py``'s lines: median (min-max) over seeds per setting."""

from __future__ import annotations

import collections
import json
import statistics
import sys
from pathlib import Path
from typing import Any


def spread(values: list[Any], fmt: str) -> str:
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{mid:{fmt}} ({low:{fmt}}-{high:{fmt}})"


def label(router: dict[str, Any]) -> str:
    text = f"{router['max_queued']} / {router['max_ongoing']}"
    if "spread_after_s" in router:
        text += f", spread_after_s {router['spread_after_s']:g}"
    return text + (" (default)" if router == {"max_queued": 8, "max_ongoing": 16} else "")


def main(path: str) -> None:
    groups: dict[tuple[str, float, str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            groups[(row["cost"], row["rate"], row["trace"], json.dumps(row["router"]))].append(row)
    shown = None
    for (cost, rate, trace, router), rows in groups.items():
        if (cost, rate, trace) != shown:
            shown = (cost, rate, trace)
            seeds = sorted(r["seed"] for r in rows)
            sys.stdout.write(f"\n{trace} at {rate:g} req/s, seeds {seeds}, {Path(cost).name}\n\n")
            sys.stdout.write("| max_queued / max_ongoing | L0 hit ratio | TTFT P50 ms | ")
            sys.stdout.write("TTFT P99 ms | saturated decisions | completed ratio |\n")
            sys.stdout.write("|---|---|---|---|---|---|\n")
        saturated = [r["decisions"].get("saturated", 0) for r in rows]
        cells = [
            label(json.loads(router)),
            spread([r["l0"] for r in rows], ".3f"),
            spread([r["p50"] for r in rows], ".1f"),
            spread([r["p99"] for r in rows], ".1f"),
            spread(saturated, "d"),
            spread([r["completed"] for r in rows], ".3f"),
        ]
        sys.stdout.write("| " + " | ".join(cells) + " |\n")


if __name__ == "__main__":
    main(sys.argv[1])
