"""Copies into a GPU slot that waited for a step: the real ones (``copy_probe``) beside the
simulated ones (issue 30, docs/simulator.md "simcold").

The real side is ``copy_probe``'s file from a ``bench sim`` run (one line per copy: the process,
its wait for the slot lock, the copy under it); its processes are listed in the order they first
copied (a ``bench sim`` run's single servers, one per trace, then the fleet's replicas). The
simulated side is ``bench sim``'s own simulation of the same traces (``prepared``,
``simulated``), each copy's wait read where the simulator charges it
(``SimReplica._lock_wait``; 0 without ``copy_waits_for_step``). Prints, per process and per
(target, trace): copies, copies that waited over ``--floor-ms``, and their waits' median, P90
and largest, in ms (each wait too, where there are at most 10).

    python scripts/sim-timeline/copy_waits.py --probe copies.jsonl --cost fleet.json \
        --trace-requests 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from loraplex.bench.sim.bench import prepared
from loraplex.bench.sim.config import SimBenchConfig
from loraplex.bench.sim.simulated import simulated
from loraplex.demo.assets import generate_demo_assets
from loraplex.sim import cost_model as cost_file
from loraplex.sim import replica


def summary(waits_s: Sequence[float], floor_ms: float) -> dict[str, Any]:
    """Copies, those that waited over ``floor_ms``, and those waits' median, P90 and max (ms;
    each wait too, up to 10 of them)."""
    waited = sorted(1e3 * w for w in waits_s if 1e3 * w > floor_ms)
    out: dict[str, Any] = {"copies": len(waits_s), "waited": len(waited)}
    if len(waited) <= 10:
        out["waits_ms"] = [round(w, 2) for w in waited]
    if waited:
        out["median_ms"] = round(statistics.median(waited), 2)
        out["p90_ms"] = round(waited[min(len(waited) - 1, int(0.9 * len(waited)))], 2)
        out["max_ms"] = round(waited[-1], 2)
    return out


def real_side(path: Path, floor_ms: float) -> list[dict[str, Any]]:
    """Per process, in the order it first copied: its copies' summary."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_pid: dict[int, list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: r["t_s"]):
        by_pid.setdefault(row["pid"], []).append(row)
    return [
        {"pid": pid, **summary([r["wait_s"] for r in copies], floor_ms)}
        for pid, copies in by_pid.items()
    ]


def simulated_side(
    config: SimBenchConfig, model: cost_file.CostModel, floor_ms: float
) -> dict[str, dict[str, Any]]:
    """Per (target, trace): the simulated copies' waits."""
    waits: dict[str, list[float]] = {}
    label = ["?"]
    charged = replica.SimReplica._lock_wait

    def recorded(self: replica.SimReplica) -> float:
        wait = charged(self)
        waits.setdefault(label[0], []).append(wait)
        return wait

    def pricing(target: str, trace: str) -> cost_file.CostModel:
        label[0] = f"{target}/{trace}"
        return model

    replica.SimReplica._lock_wait = recorded  # type: ignore[method-assign]
    try:
        assets = generate_demo_assets(config.asset_dir / "test-small", preset="small", seed=0)
        workloads = config.workloads()
        with tempfile.TemporaryDirectory(prefix="loraplex-copy-waits-") as tmp:
            registry = prepared(config, workloads, Path(tmp), assets.base_model_dir)
            simulated(config, workloads, pricing, registry)
    finally:
        replica.SimReplica._lock_wait = charged  # type: ignore[method-assign]
    return {name: summary(w, floor_ms) for name, w in waits.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--probe", type=Path, help="copy_probe's file of a real run")
    parser.add_argument("--cost", type=Path, required=True, help="the cost file to simulate")
    parser.add_argument("--trace-requests", type=int, default=64)
    parser.add_argument("--floor-ms", type=float, default=0.2, help="a wait under it: none")
    args = parser.parse_args()
    if args.probe is not None:
        for row in real_side(args.probe, args.floor_ms):
            sys.stdout.write(f"real {json.dumps(row)}\n")
    config = SimBenchConfig(trace_requests=args.trace_requests, scale=None)
    model = replace(cost_file.load(args.cost), copy_waits_for_step=True)
    for name, row in simulated_side(config, model, args.floor_ms).items():
        sys.stdout.write(f"sim {name} {json.dumps(row)}\n")


if __name__ == "__main__":
    main()
