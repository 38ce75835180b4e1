"""Which adapters a full run's separate deployments merge and judge: every demo-set adapter,
and adapters outside it (qualification's generated ones, whose files the cell names) up to a
budget per run, the cell's most requested first; one judged before is judged again in any
cell. No server starts here: only the plan of jobs."""

from __future__ import annotations

from pathlib import Path

from loraplex.demo.assets import DemoAssets
from loraplex.qualify.baselines import BaselineContext, CellTraffic, Probe
from loraplex.qualify.baselines import measure as measure_module
from loraplex.qualify.baselines.demo_set import cache_of, load_assets
from loraplex.qualify.baselines.separate import (
    _QUALITY_REFS,
    FULL_GENERATED_QUALITY_ADAPTERS,
    _jobs,
)
from loraplex.qualify.cost import TOKEN_SHAPES, MachinePrice


def _cell(refs: list[str], demand: dict[str, float], dirs: dict[str, Path]) -> CellTraffic:
    probes = [Probe(ref, f"probe of {ref}:", "answer") for ref in refs]
    return CellTraffic("c", TOKEN_SHAPES["short"], 10, 10.0, demand, 3.0, 0.5, probes, dirs)


def test_generated_adapters_are_judged_within_the_budget_most_requested_first(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    price = MachinePrice("m", 1.0, "test")
    ctx = BaselineContext(demo_assets.root, demo_assets.preset, price, tmp_path, quick=False)
    assets = load_assets(ctx)
    generated = [f"qualify-a/all-8-{i:04d}@q2" for i in range(FULL_GENERATED_QUALITY_ADAPTERS + 4)]
    demo = [a.ref for a in assets.adapters[:2]]
    # demand grows with the index: the last generated ones are the most requested
    demand = {ref: float(i) for i, ref in enumerate(generated)} | dict.fromkeys(demo, 0.0)
    dirs = {ref: tmp_path / ref for ref in generated}
    jobs = _jobs(ctx, _cell(generated + demo, demand, dirs), assets)
    judged = [job.ref for job in jobs]
    assert set(demo) <= set(judged)  # every demo adapter, whatever the budget
    picked = [ref for ref in judged if ref in dirs]
    assert picked == generated[::-1][:FULL_GENERATED_QUALITY_ADAPTERS]

    # Once the budget is spent, an adapter judged before is still judged in a later cell, and
    # a new one is not.
    measure_module.RunCache(cache_of(ctx)).put(_QUALITY_REFS, picked)
    later = [generated[-1], generated[0]]
    jobs = _jobs(ctx, _cell(later, demand, dirs), assets)
    assert [job.ref for job in jobs if job.probes] == [generated[-1]]
