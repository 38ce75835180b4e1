"""``bench sim``'s simulated side for several cost files against stored real sides (issue 30).

The real side of a ``docs/benchmarks/sim-runs.jsonl`` line (its per-trace medians) against the
simulated side of each cost file, through ``bench/sim/bench.py``'s own ``prepared`` and
``simulated`` on the line's traces and trace length; the simulator is deterministic, so no real
run is needed. Prints the single target's errors per file and line (hit pp / P50 / P99).

    python scripts/sim-timeline/offline.py --lines 20,21 --cost A.json --cost B.json

``RUNS`` (an environment variable) names another file of ``bench sim`` JSON lines to read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from loraplex.bench.sim.bench import prepared, priced
from loraplex.bench.sim.compare import compare_target
from loraplex.bench.sim.config import SimBenchConfig
from loraplex.bench.sim.simulated import simulated
from loraplex.sim import cost_model as cost_file

RUNS = Path(os.environ.get("RUNS", "docs/benchmarks/sim-runs.jsonl"))  # as offline_fleet.py


def real_side(line: dict[str, Any]) -> dict[str, Any]:
    traces = line["metrics"]["targets"]["single"]["traces"]
    return {name: {k: v for k, v in t["real"].items() if k != "runs"} for name, t in traces.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", default="20,21")
    parser.add_argument("--cost", type=Path, action="append", required=True)
    args = parser.parse_args()
    lines = {
        int(n): json.loads(RUNS.read_text().splitlines()[int(n) - 1]) for n in args.lines.split(",")
    }
    first = next(iter(lines.values()))["config"]
    config = SimBenchConfig(
        traces=tuple(sorted(real_side(next(iter(lines.values()))))),
        targets=("single",),
        trace_requests=first["trace_requests"],
        rate=first["rate"],
        seed=first["seed"],
        scale=None,
    )
    from loraplex.demo.assets import generate_demo_assets

    assets = generate_demo_assets(config.asset_dir / "test-small", preset="small", seed=0)
    workloads = config.workloads()
    with tempfile.TemporaryDirectory(prefix="loraplex-offline-") as tmp:
        registry = prepared(config, workloads, Path(tmp), assets.base_model_dir)
        for path in args.cost:
            sims = simulated(config, workloads, priced(cost_file.load(path)), registry)["single"]
            for n, line in lines.items():
                result = compare_target(real_side(line), sims, "single")
                e = result["errors"]
                per = {
                    name: (
                        t["sim"]["ttft_ms"]["p50"],
                        t["real"]["ttft_ms"]["p50"],
                        t["errors"]["ttft_p50_rel_error"],
                        t["sim"]["ttft_ms"]["p99"],
                        t["real"]["ttft_ms"]["p99"],
                    )
                    for name, t in result["traces"].items()
                }
                sys.stdout.write(
                    f"{path.name} line {n}: hit {e['hit_ratio_abs_error_pp']} pp, P50 "
                    f"{e['ttft_p50_rel_error']}, P99 {e['ttft_p99_rel_error']}, throughput "
                    f"{e['throughput_rel_error']}; P50 sim/real/err, P99 sim/real {per}\n"
                )


if __name__ == "__main__":
    main()
