"""What a fresh server's first requests pay beyond the same run's later ones (issue 30).

Reads ``bench sim --logs-dir``'s single-server logs (each run a fresh ``loraplex serve``, no
warm-up) and, per run, for its first ``--first`` requests by arrival: the load's excess (its
stage seconds less its price under ``--cost-model``'s L3 -> L2 and L2 -> L1 links times the
median stage-over-price of the run's later L3 loads that ran with nothing beside them,
``busy_loads.beside``), the outside-engine excess (client TTFT less the engine's first step
end, less the median of the run's later requests) and the first step's excess (plan -> end,
less the later requests' median). Prints one JSON object per request and the medians over
runs of the first request's excesses (ms): what ``first_load_s`` and ``first_hop_s`` price.

    python scripts/sim-timeline/first_requests.py --logs-dir /tmp/logs [--logs-dir /tmp/logs2] \
        --cost-model cal.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from busy_loads import beside
from logs import logged_runs

from loraplex.sim import cost_model as cost_file

IDLE = 0.05  # a later load "ran with nothing beside it" below this mean number served


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x]


def _outside(line: dict[str, Any], ttft: float | None) -> float | None:
    e = line.get("engine") or {}
    if ttft is None or e.get("first_step_end_s") is None:
        return None
    return ttft - e["first_step_end_s"]


def _step(line: dict[str, Any]) -> float | None:
    e = line.get("engine") or {}
    if e.get("first_step_end_s") is None or e.get("scheduled_s") is None:
        return None
    return e["first_step_end_s"] - e["scheduled_s"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--logs-dir", type=Path, action="append", required=True)
    parser.add_argument("--cost-model", type=Path, required=True)
    parser.add_argument("--trace-requests", type=int, default=64)
    parser.add_argument("--first", type=int, default=3)
    args = parser.parse_args()
    links = cost_file.load(args.cost_model).links
    firsts: dict[str, list[float]] = {"load": [], "outside": [], "step": []}
    runs = 0
    for logs_dir in args.logs_dir:
        runs += _read(logs_dir, links, args, firsts)
    medians = {k: round(statistics.median(v), 2) if v else None for k, v in firsts.items()}
    sys.stdout.write(f"first request, median over {runs} runs: {json.dumps(medians)}\n")


def _read(
    logs_dir: Path, links: Any, args: argparse.Namespace, firsts: dict[str, list[float]]
) -> int:
    """Prints ``logs_dir``'s runs' first requests, adds each run's first to ``firsts``; returns
    the number of runs."""
    logged = logged_runs(logs_dir, args.trace_requests)
    for run in logged.runs:
        lines = sorted(_lines(run.path), key=lambda x: x["t_s"])
        client = _lines(logs_dir / f"{run.stem}.client.jsonl")
        # the client's TTFT (what the bench reports), paired by (tenant, adapter) in arrival
        # order as ``probe.paired`` does
        queues: dict[tuple[str, str], list[float | None]] = {}
        for c in sorted(client, key=lambda c: c["t_s"]):
            queues.setdefault((c["tenant"], c["adapter"]), []).append(c.get("ttft_s"))
        clock = [queues[(x["tenant"], x["adapter"].partition("@")[0])].pop(0) for x in lines]

        def price(line: dict[str, Any]) -> float:
            size = logged.sizes[(line["tenant"], line["adapter"].split("@")[0])]
            return links["L3_to_L2"].seconds(size) + links["L2_to_L1"].seconds(size)

        later = range(args.first, len(lines))
        idle = []
        for i in later:
            row = beside(lines, i)
            if row is not None and row["mean_running"] < IDLE:
                idle.append(row["load_s"] / price(lines[i]))
        ratio = statistics.median(idle)
        outs = [o for i in later if (o := _outside(lines[i], clock[i])) is not None]
        steps = [s for i in later if (s := _step(lines[i])) is not None]
        out_med, step_med = statistics.median(outs), statistics.median(steps)
        for i in range(args.first):
            line = lines[i]
            e = line.get("engine") or {}
            load = None
            if line.get("tier") == "L3" and e.get("load_s") is not None:
                load = e["load_s"] - ratio * price(line)
            out, step = _outside(line, clock[i]), _step(line)
            row = {
                "run": run.stem,
                "index": i,
                "adapter": line["adapter"],
                "tier": line.get("tier"),
                "idle_load_over_price": round(ratio, 3),
                "load_excess_ms": None if load is None else round(load * 1e3, 2),
                "outside_excess_ms": None if out is None else round((out - out_med) * 1e3, 2),
                "step_excess_ms": None if step is None else round((step - step_med) * 1e3, 2),
            }
            sys.stdout.write(json.dumps(row) + "\n")
            if i == 0:
                for name, kept in firsts.items():
                    value = row[f"{name}_excess_ms"]
                    if value is not None:
                        kept.append(value)
    return len(logged.runs)


if __name__ == "__main__":
    main()
