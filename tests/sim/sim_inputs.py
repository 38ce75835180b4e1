"""Shared inputs of the simulator's tests: the example cost model and WORKLOADS.md scenarios as
simulator traces (through the CLI's conversion, the one ``loraplex sim run --workload`` uses)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loraplex.cli.sim import workload_trace
from loraplex.sim.cost_model import CostModel, load
from loraplex.sim.trace import TraceRecord

COST_FILE = Path(__file__).resolve().parent / "cost_example.json"


def cost() -> CostModel:
    return load(COST_FILE)


def scenario(name: str, duration_s: float = 20.0, rate: float = 20.0) -> list[TraceRecord]:
    return workload_trace(name, seed=0, duration_s=duration_s, rate=rate)


def calibration_measured() -> dict[str, Any]:
    """What ``bench/sim/calibration.measure`` returns for a synthetic server (steps over tokens,
    revisions and ranks, lone prefill hops, two sizes per link), without cold samples or hop
    residuals: a test adds those."""
    from loraplex.sim.calibrate import LoadSample, StepSample, fit_step
    from loraplex.sim.cost_model import LINKS

    steps = [
        StepSample(t, 0, r, t * k, 0.002 + 1e-4 * t + 3e-4 * r + 1e-7 * t * k)
        for t in (1, 4, 16)
        for r in (1, 2)
        for k in (8, 64)
    ]
    steps += [
        StepSample(0, n, 1, n * k, 0.004 + 2e-5 * n + 1e-7 * n * k, hop=True)
        for n in (8, 32)
        for k in (8, 64)
    ]
    loads = [LoadSample(link, n, 0.001 + n / 1e9) for link in LINKS for n in (1000, 9000)]
    measured = {"loads": loads, "steps": steps, "step_fit": fit_step(steps), "front_s": 0.001}
    ttft = [s for s in steps if s.hop]  # no engine timelines: the TTFT-based prefills are fitted
    # no lone requests kept: the fitted hop stands
    measured["decode_mixes"] = []  # no decode mix runs recorded (the steps are given)
    # no cold load timed beside running steps: load_busy_scale is not measured
    return {**measured, "lone": [], "ttft_prefills": ttft, "timings": [], "timed": [], "busy": []}
