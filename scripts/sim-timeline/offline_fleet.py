"""``bench sim``'s simulated fleet side for cost files (and contention variants) against stored
real sides (docs/simulator.md, "SIMFLEET2"); deterministic, no real run. Each argument after the
line numbers is ``FILE``, ``FILE:none`` (its ``fleet_contention`` removed) or
``FILE:K1,K2/S1,S2`` (that curve instead); ``STEPS_ONLY=1`` charges the curve on steps only.
Prints per line the fleet's errors and per trace (sim P50, real P50, sim P99, real P99, sim
warm P50, real warm P50, sim L0, real L0, the trace's errors).

    python scripts/sim-timeline/offline_fleet.py 32,23 fleet.json fleet.json:none
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from loraplex.bench.sim.bench import prepared, priced
from loraplex.bench.sim.compare import compare_target
from loraplex.bench.sim.config import SimBenchConfig
from loraplex.bench.sim.simulated import simulated
from loraplex.demo.assets import generate_demo_assets
from loraplex.sim import cost_model as cost_file
from loraplex.sim import cpu
from loraplex.sim.cpu import Contention

RUNS = Path(os.environ.get("RUNS", "docs/benchmarks/sim-runs.jsonl"))


def real_side(line: dict[str, Any]) -> dict[str, Any]:
    traces = line["metrics"]["targets"]["fleet"]["traces"]
    return {n: {k: v for k, v in t["real"].items() if k != "runs"} for n, t in traces.items()}


def variant(spec: str) -> cost_file.CostModel:
    path, _, curve = spec.partition(":")
    model = cost_file.load(Path(path))
    if curve == "none":
        return replace(model, fleet_contention=None)
    if curve:
        counts, stretch = curve.split("/")
        chosen = Contention(
            tuple(int(x) for x in counts.split(",")), tuple(float(x) for x in stretch.split(","))
        )
        return replace(model, fleet_contention=chosen)
    return model


def per_trace(result: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    out = {}
    for name, t in result["traces"].items():
        sim, real = t["sim"], t["real"]
        out[name] = (
            sim["ttft_ms"]["p50"], real["ttft_ms"]["p50"], sim["ttft_ms"]["p99"],
            real["ttft_ms"]["p99"], sim["ttft_ms_warm"]["p50"], real["ttft_ms_warm"]["p50"],
            sim["hit_ratio"]["L0"], real["hit_ratio"]["L0"],
            {e: round(v, 3) for e, v in t["errors"].items()},
        )  # fmt: skip
    return out


def main() -> None:
    if os.environ.get("STEPS_ONLY"):
        cpu.CpuShare.hop_stretch = lambda self: 1.0  # type: ignore[method-assign]
    all_lines = RUNS.read_text().splitlines()
    lines = {int(n): json.loads(all_lines[int(n) - 1]) for n in sys.argv[1].split(",")}
    first = next(iter(lines.values()))
    config = SimBenchConfig(
        traces=tuple(sorted(real_side(first))),
        targets=("fleet",),
        trace_requests=first["config"]["trace_requests"],
        rate=first["config"]["rate"],
        seed=first["config"]["seed"],
        scale=None,
    )
    assets = generate_demo_assets(config.asset_dir / "test-small", preset="small", seed=0)
    workloads = config.workloads()
    with tempfile.TemporaryDirectory() as tmp:
        registry = prepared(config, workloads, Path(tmp), assets.base_model_dir)
        for spec in sys.argv[2:]:
            sims = simulated(config, workloads, priced(variant(spec)), registry)["fleet"]
            for n, line in lines.items():
                result = compare_target(real_side(line), sims, "fleet")
                sys.stdout.write(f"{spec} line {n}: {result['errors']} {per_trace(result)}\n")


if __name__ == "__main__":
    main()
