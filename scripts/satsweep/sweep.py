"""satsweep (2026-12-07): the router's saturation point in the simulator, 3 replicas.

``max_queued`` x ``max_ongoing`` (and ``spread_after_s`` at the default bounds) through
``SimConfig.router``, the same table ``loraplex sim run --router`` takes (one point was checked
equal to the command line's). Deterministic: no timing, so no lock is needed.

Usage: sweep.py COST_FILE RATE OUT.jsonl [TRACES] [SEEDS] [MAX_LORAS]
(TRACES default hot-burst,zipf-longtail,hot-one; SEEDS 0,1,2; MAX_LORAS 4). Appends one JSON
line per run; ``table.py OUT.jsonl`` prints the median (min-max) per setting.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from loraplex.cli.sim import workload_trace
from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import load
from loraplex.sim.run import simulate

SETTINGS = [{"max_queued": q, "max_ongoing": o} for q in (2, 4, 8, 12) for o in (8, 16, 24)]
SETTINGS += [{"max_queued": 8, "max_ongoing": 16, "spread_after_s": s} for s in (1.0, 3.0)]


def main(argv: list[str]) -> None:
    cost_file, rate, out = argv[1], float(argv[2]), Path(argv[3])
    traces = (argv[4] if len(argv) > 4 else "hot-burst,zipf-longtail,hot-one").split(",")
    seeds = [int(s) for s in (argv[5] if len(argv) > 5 else "0,1,2").split(",")]
    max_loras = int(argv[6]) if len(argv) > 6 else 4
    model = load(Path(cost_file))
    with out.open("a") as f:
        for name in traces:
            for seed in seeds:
                records = workload_trace(name, seed, 60.0, rate)
                for router in SETTINGS:
                    config = SimConfig(replicas=3, max_loras=max_loras, seed=seed, router=router)
                    m = simulate(records, config, model).metrics
                    row = {
                        "cost": cost_file, "rate": rate, "trace": name, "seed": seed,
                        "router": router, "l0": m["l0_hit_ratio"], "p50": m["ttft_ms"]["p50"],
                        "p99": m["ttft_ms"]["p99"], "completed": m["completed_ratio"],
                        "decisions": m["decisions"], "requests": m["requests"],
                    }  # fmt: skip
                    f.write(json.dumps(row) + "\n")
                    f.flush()


if __name__ == "__main__":
    main(sys.argv)
