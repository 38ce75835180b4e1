"""What a real cold load from the store ran beside, and what it cost over its price (issue 30).

Reads ``bench sim --logs-dir``'s server request logs (``single-r<repeat>-<trace>.requests.jsonl``;
every line's ``t_s`` is its arrival on the log's clock, its ``engine`` stamps seconds after it)
and prices each L3 request's load with ``--cost-model`` (fetch + read of the adapter's bytes,
the simulator's ``CostModelPipeline`` links). Per load: its stage seconds (``load_s``) over
that price, and what ran on the engine during its window (asked -> ready): the time-averaged
number of other requests being served (first plan -> end), the fraction of the window with one
or more, whether one was served at the window's start (what the simulator reads), and the
number of prefills (a request's first step) that ran in it. Prints one JSON object per load
(``--out``) and the medians of ``load/price`` by the average number served beside it.

    python scripts/sim-timeline/busy_loads.py --logs-dir /tmp/logs --cost-model cal.json \
        [--out rows.jsonl]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from logs import logged_runs

from loraplex.sim import cost_model as cost_file


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x]


def _served(line: dict[str, Any]) -> tuple[float, float] | None:
    e = line.get("engine") or {}
    if e.get("scheduled_s") is None or e.get("end_s") is None:
        return None
    return line["t_s"] + e["scheduled_s"], line["t_s"] + e["end_s"]


def beside(lines: list[dict[str, Any]], i: int) -> dict[str, Any] | None:
    """Line ``i``'s load window and what the engine served beside it."""
    line = lines[i]
    e = line.get("engine") or {}
    if line.get("tier") != "L3" or e.get("load_s") is None or e.get("ready_s") is None:
        return None
    start, end = line["t_s"] + e.get("asked_s", 0.0), line["t_s"] + e["ready_s"]
    width = max(end - start, 1e-9)
    overlap, covered, at_start, prefills = 0.0, [], 0, 0
    for j, other in enumerate(lines):
        span = None if j == i else _served(other)
        if span is None:
            continue
        lo, hi = max(start, span[0]), min(end, span[1])
        if hi > lo:
            overlap += hi - lo
            covered.append((lo, hi))
        if span[0] <= start < span[1]:
            at_start += 1
        first = other["engine"].get("first_step_end_s")
        if first is not None and start <= other["t_s"] + first <= end:
            prefills += 1
    covered.sort()
    busy, reach = 0.0, start
    for lo, hi in covered:
        if hi > reach:
            busy += hi - max(lo, reach)
            reach = hi
    return {
        "window_s": round(width, 6),
        "load_s": e["load_s"],
        "mean_running": round(overlap / width, 3),
        "busy_fraction": round(busy / width, 3),
        "running_at_start": at_start,
        "prefills": prefills,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--logs-dir", type=Path, required=True)
    parser.add_argument("--cost-model", type=Path, required=True)
    parser.add_argument("--trace-requests", type=int, default=64)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    links = cost_file.load(args.cost_model).links
    logged = logged_runs(args.logs_dir, args.trace_requests)
    rows = []
    for run in logged.runs:
        lines = _lines(run.path)
        for i, line in enumerate(lines):
            row = beside(lines, i)
            if row is None:
                continue
            name = line["adapter"].split("@")[0]
            size = logged.sizes[(line["tenant"], name)]
            price = links["L3_to_L2"].seconds(size) + links["L2_to_L1"].seconds(size)
            ttft = line.get("ttft_s")
            row.update(run=run.stem, adapter=line["adapter"], bytes=size)
            row.update(price_s=round(price, 6), ratio=round(row["load_s"] / price, 3))
            row.update(ttft_ms=None if ttft is None else round(ttft * 1e3, 2))
            rows.append(row)
    if args.out is not None:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    bands = ((0.0, 0.05), (0.05, 1.0), (1.0, 2.0), (2.0, 4.0), (4.0, 1e9))
    for lo, hi in bands:
        kept = [r for r in rows if lo <= r["mean_running"] < hi]
        if kept:
            sys.stdout.write(
                f"mean running [{lo}, {hi}): n {len(kept)}, load/price median "
                f"{statistics.median(r['ratio'] for r in kept):.2f}, load ms median "
                f"{statistics.median(r['load_s'] for r in kept) * 1e3:.2f}\n"
            )
    for flag in (False, True):
        kept = [r for r in rows if (r["running_at_start"] > 0) is flag]
        if kept:
            sys.stdout.write(
                f"busy at start {flag}: n {len(kept)}, load/price median "
                f"{statistics.median(r['ratio'] for r in kept):.2f}\n"
            )


if __name__ == "__main__":
    main()
