"""How much a fleet's hit ratios move with its replica ids alone, in the simulator, and what a
recorded ``bench sim`` line's fleet error is against the mean over drawn ids.

A cold revision is placed by rendezvous hashing over the replica ids (``router/placement.py``),
and Ray Serve draws a fresh random id for every replica of a deployment, so every real fleet
run partitions the revisions over its replicas differently; the simulator named its replicas
``replica-000``.. and always placed alike. (Since 2026-12-06, simrank, the fleet places by
replica rank and the simulator names its replicas ``rank-0``..: this is a tool for the lines
recorded before, and names the "own" replicas ``replica-000``.. as their simulator did.) This
simulates each of ``bench sim``'s traces with ``--draws`` sets of Ray-like ids
(``bench/sim/simulated.id_drawn_hit_ratios``, as ``bench sim --fleet-id-draws`` does),
everything else as ``bench sim``'s fleet side with the cost file, and prints per trace the
simulator's own names' hit ratios, the draws' mean, min and max; with ``--line`` (a ``bench
sim --json`` output line, or a file of them and ``--line-no``) also its real runs' mean hit
ratios, and the error (max over tiers, pp) of its recorded
simulation and of the draws' mean.

    PYTHONPATH=. python scripts/sim-timeline/fleet_id_spread.py --cost-model fleet.json \
        [--trace-requests 64] [--draws 16] [--seed 0] [--line runs.jsonl --line-no 61]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from logs import logged_runs

from loraplex.bench.sim.config import TRACES
from loraplex.bench.sim.simulated import TIERS, id_drawn_hit_ratios
from loraplex.sim import cost_model as cost_file
from loraplex.sim.call import simulate_metrics


def _error_pp(real: dict[str, Any], sim: dict[str, Any]) -> float:
    return round(max(100 * abs(real[t] - sim[t]) for t in TIERS), 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cost-model", type=Path, required=True)
    parser.add_argument("--trace-requests", type=int, default=64)
    parser.add_argument("--draws", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--traces", default=",".join(TRACES))
    parser.add_argument("--line", type=Path)
    parser.add_argument("--line-no", type=int, default=1)
    args = parser.parse_args()
    cost = cost_file.load(args.cost_model)
    recorded: dict[str, Any] = {}
    if args.line is not None:
        text = args.line.read_text(encoding="utf-8").splitlines()[args.line_no - 1]
        recorded = json.loads(text)["metrics"]["targets"]["fleet"]["traces"]
    with tempfile.TemporaryDirectory(prefix="loraplex-spread-") as tmp:
        for name in args.traces.split(","):  # empty run logs: logged_runs wants a file a trace
            (Path(tmp) / f"fleet-r0-{name}.client.jsonl").touch()
        logged = logged_runs(Path(tmp), args.trace_requests, "fleet")
    for run in logged.runs:
        # the names the recorded lines' simulator gave its replicas (``rank-0``.. since simrank)
        recorded_names = [f"replica-{i:03d}" for i in range(logged.values["replicas"])]
        own = simulate_metrics(run.trace, logged.values, cost, recorded_names)["hit_ratio"]
        drawn = id_drawn_hit_ratios(run.trace, logged.values, cost, args.draws, args.seed)
        body: dict[str, Any] = {"own_ids": own, **drawn}
        body["range_pp"] = {t: round(100 * (drawn["max"][t] - drawn["min"][t]), 2) for t in TIERS}
        line = recorded.get(run.workload.name)
        if line is not None:
            runs = [r["hit_ratio"] for r in line["real"].get("runs", [])] or [
                line["real"]["hit_ratio"]
            ]
            real = {t: sum(r[t] for r in runs) / len(runs) for t in TIERS}
            body["real_mean"] = {t: round(v, 4) for t, v in real.items()}
            body["error_pp_recorded_sim"] = _error_pp(real, line["sim"]["hit_ratio"])
            body["error_pp_own_ids"] = _error_pp(real, own)
            body["error_pp_draws_mean"] = _error_pp(real, drawn["mean"])
            if len(runs) > 1:
                body["real_runs_spread_pp"] = _error_pp(runs[0], runs[1])
        sys.stdout.write(f"{run.workload.name} {json.dumps(body)}\n")


if __name__ == "__main__":
    main()
