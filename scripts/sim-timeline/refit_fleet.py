"""A hold's contention curve refitted offline from its own measured rounds under model variants,
then its three traces simulated against that hold's stored real side (docs/simulator.md,
"SIMFLEET3"). Deterministic, no real run. ``VARIANT`` (comma list): ``spread`` (the simulator's
round adapters placed one per replica, ``contention_rounds.place``), ``steps_only`` (the curve
stretches steps, not hops), ``excl_wait`` (requests waiting for an adapter load leave the
in-flight count).

    VARIANT=spread,steps_only python scripts/sim-timeline/refit_fleet.py spread4 47
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from loraplex.bench.sim.bench import prepared, priced
from loraplex.bench.sim.compare import compare_target
from loraplex.bench.sim.config import SimBenchConfig
from loraplex.bench.sim.contention_fit import RoundShape, fit_by_simulation, warm_replicas
from loraplex.bench.sim.contention_rounds import candidates, place
from loraplex.bench.sim.simulated import sim_config, simulated
from loraplex.bench.sim.validate import RealSettings
from loraplex.bench.workloads import TraceAdapter
from loraplex.demo.assets import generate_demo_assets
from loraplex.sim import cost_model as cost_file
from loraplex.sim import cpu, replica
from loraplex.sim.config import SimConfig
from loraplex.sim.cpu import Contention

BENCH = Path("docs/benchmarks")
BYTES, PER_RANK = 212_992, 26_624  # a rank-8 attention adapter of the demo model, float32


def _shape(names: Sequence[str]) -> RoundShape:
    return RoundShape(tuple(("fleetcal", n, 8, BYTES) for n in names), 4, 16, 8)


def _exclude_waiting() -> None:
    """Requests waiting for an adapter load leave the count the curve reads, and return once
    their lease is collected."""
    asked, collected = replica.SimReplica._request_leases, replica.SimReplica._collect_leases

    def request_leases(self: Any) -> None:
        before = set(self._pending)
        asked(self)
        if self._cpu is not None:
            self._cpu.requests -= len(set(self._pending) - before)

    def collect_leases(self: Any) -> None:
        before = set(self._pending)
        collected(self)
        if self._cpu is not None:
            self._cpu.requests += len(before - set(self._pending))

    replica.SimReplica._request_leases = request_leases  # type: ignore[method-assign]
    replica.SimReplica._collect_leases = collect_leases  # type: ignore[method-assign]


def main() -> None:
    hold, line_no = sys.argv[1], int(sys.argv[2])
    variant = set(filter(None, os.environ.get("VARIANT", "").split(",")))
    stem = f"sim-cost-cpu-2core-demo-small-2026-12-05-{hold}-fleet"
    model = cost_file.load(BENCH / f"{stem}.json")
    report = json.loads((BENCH / f"{stem}-samples.json").read_text())
    if "steps_only" in variant:
        cpu.CpuShare.hop_stretch = lambda self: 1.0  # type: ignore[method-assign]
    if "excl_wait" in variant:
        _exclude_waiting()
    measured = {int(k): v for k, v in report["contention_fit"]["measured"].items()}
    first = Contention(tuple(measured), tuple(report["contention_first_pass"]))
    settings = RealSettings(replicas=3)
    sim = SimConfig(**sim_config(SimBenchConfig(settings=settings), "fleet", PER_RANK, {}))
    names = ["c0", "c1", "c2"]
    if "spread" in variant:

        def land(adapter: TraceAdapter, kept: Sequence[TraceAdapter]) -> int:
            return warm_replicas(model, sim, _shape([*(k.name for k in kept), adapter.name]))[-1]

        placed = place(candidates("fleetcal", 3), 3, 3, land, lambda _: None)
        names = [a.name for a in placed.adapters]
    fit = fit_by_simulation(
        replace(model, fleet_contention=first), sim, _shape(names), measured, first
    )
    out = sys.stdout
    out.write(f"variant {sorted(variant)} rounds on {names} ")
    out.write(f"(simulated replicas {warm_replicas(model, sim, _shape(names))})\n")
    out.write(f"fitted {[round(s, 3) for s in fit.contention.stretch]} gap {fit.worst_gap:.4f}; ")
    out.write(f"the file's {[round(s, 3) for s in model.fleet_contention.stretch]}\n")
    lines = (BENCH / "sim-runs.jsonl").read_text().splitlines()
    line = json.loads(lines[line_no - 1])
    traces = line["metrics"]["targets"]["fleet"]["traces"]
    real = {n: {k: v for k, v in t["real"].items() if k != "runs"} for n, t in traces.items()}
    config = SimBenchConfig(
        traces=tuple(sorted(real)), targets=("fleet",), trace_requests=64, scale=None
    )
    assets = generate_demo_assets(config.asset_dir / "test-small", preset="small", seed=0)
    workloads = config.workloads()
    with tempfile.TemporaryDirectory() as tmp:
        registry = prepared(config, workloads, Path(tmp), assets.base_model_dir)
        fitted = replace(model, fleet_contention=fit.contention)
        sims = simulated(config, workloads, priced(fitted), registry)["fleet"]
    result = compare_target(real, sims, "fleet")
    out.write(f"errors { ({k: round(v, 4) for k, v in result['errors'].items()}) }\n")
    for name, t in result["traces"].items():
        sim_ms, real_ms = t["sim"]["ttft_ms"], t["real"]["ttft_ms"]
        out.write(
            f"  {name} P50 {sim_ms['p50']:.1f} / {real_ms['p50']:.1f}, "
            f"P99 {sim_ms['p99']:.1f} / {real_ms['p99']:.1f} (sim / real ms)\n"
        )


if __name__ == "__main__":
    main()
