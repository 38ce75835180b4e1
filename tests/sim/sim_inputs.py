"""Shared inputs of the simulator's tests: the example cost model and WORKLOADS.md scenarios as
simulator traces (through the CLI's conversion, the one ``loraplex sim run --workload`` uses)."""

from __future__ import annotations

from pathlib import Path

from loraplex.cli.sim import workload_trace
from loraplex.sim.cost_model import CostModel, load
from loraplex.sim.trace import TraceRecord

COST_FILE = Path(__file__).resolve().parent / "cost_example.json"


def cost() -> CostModel:
    return load(COST_FILE)


def scenario(name: str, duration_s: float = 20.0, rate: float = 20.0) -> list[TraceRecord]:
    return workload_trace(name, seed=0, duration_s=duration_s, rate=rate)
