"""Separate deployments: one dense model per adapter (the adapter merged by PEFT,
``dense.py``), each on replicas of its own.

Measured here, on dedicated servers (``loraplex serve`` with the merged checkpoint as its base
model and no adapter): a load sweep per token shape (capacity and latency at each concurrency),
a replica's peak memory, its cold start (process start to first answer: a full model load), and
the merged model's probe pass ratio on the cell's probes. Every merged model of one base has the
same shapes, so one adapter's server stands for all in capacity, memory and cold start; quality
is measured per adapter, on that adapter's own merged model. Then the deployment the cell's
traffic needs is priced (``pricing.py``).
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from loraplex.demo.manifest import DemoAssets, read_manifest
from loraplex.qualify.baselines import measure
from loraplex.qualify.baselines.demo_set import (
    cache_of,
    load_assets,
    max_model_len,
    server_dir,
    vocab_size,
)
from loraplex.qualify.baselines.dense import merged_models
from loraplex.qualify.baselines.load import LoadSpec, first_answer_s
from loraplex.qualify.baselines.priced import Footprint, price_separate
from loraplex.qualify.baselines.server import (
    ServerSpec,
    comparator_server,
    machine_memory_bytes,
    peak_rss_bytes,
)
from loraplex.qualify.baselines.types import BaselineContext, CellTraffic, MethodResult, Probe

# Adapters whose merged model is started for quality in one quick run (each start is a full
# model load); the rest of the cell's probes are reported as not measured.
QUICK_QUALITY_ADAPTERS = 1
# Adapters outside the demo set (qualification's generated ones, files from
# ``CellTraffic.adapter_dirs``) merged and judged in one full run: a cell reaches up to a dozen
# of them and a run over a thousand, each a merge and a full model load. Those already judged
# are judged again in every cell that reaches them; the rest are reported as not judged.
# (Demo-set adapters, 16 at most, are all judged, as before.)
FULL_GENERATED_QUALITY_ADAPTERS = 8
_COLD_STARTS = "separate/cold-starts"
_QUALITY_REFS = "separate/quality-refs"


@dataclass(frozen=True)
class _Job:
    """One dedicated server to run: which adapter, and what to measure on it."""

    ref: str  # the adapter merged into its model
    probes: tuple[Probe, ...]  # probes of that adapter still to judge
    sweep: bool  # whether the cell's shape still needs its load sweep


def _jobs(ctx: BaselineContext, cell: CellTraffic, assets: DemoAssets) -> list[_Job]:
    cache = measure.RunCache(cache_of(ctx))
    demo = {a.ref for a in assets.adapters}
    known = demo | set(cell.adapter_dirs)
    todo: dict[str, list[Probe]] = {}
    for probe in cell.probes:
        if probe.adapter_ref in known and cache.get(_quality_key(probe)) is None:
            todo.setdefault(probe.adapter_ref, []).append(probe)
    # the cell's most requested adapters first: a budget goes where the traffic is
    demand = cell.demand_per_adapter_rps
    todo = dict(sorted(todo.items(), key=lambda item: -demand.get(item[0], 0.0)))
    measured = set(_measured_refs(cache))
    if ctx.quick:
        todo = _within_room(todo, measured, QUICK_QUALITY_ADAPTERS)
    else:  # every demo adapter; generated ones up to their budget
        generated = _within_room(
            {r: p for r, p in todo.items() if r not in demo},
            measured - demo,
            FULL_GENERATED_QUALITY_ADAPTERS,
        )
        todo = {r: p for r, p in todo.items() if r in demo or r in generated}
    need_sweep = cache.get(_sweep_key(cell)) is None
    jobs = [_Job(ref, tuple(probes), False) for ref, probes in todo.items()]
    if need_sweep:
        if jobs:
            jobs[0] = _Job(jobs[0].ref, jobs[0].probes, True)
        else:
            jobs.append(_Job(assets.adapters[0].ref, (), True))
    return jobs


def _within_room(
    todo: dict[str, list[Probe]], measured: set[str], budget: int
) -> dict[str, list[Probe]]:
    """The adapters already started, and new ones up to ``budget`` in all."""
    room = budget - len(measured)
    kept = {}
    for ref, probes in todo.items():
        if ref in measured or room > 0:
            kept[ref] = probes
            room -= ref not in measured
    return kept


def _measured_refs(cache: measure.RunCache) -> list[str]:
    """Adapters whose merged model has been started for quality in this run."""
    raw = cache.get(_QUALITY_REFS)
    return [str(r) for r in raw] if isinstance(raw, list) else []


def _quality_key(probe: Probe) -> str:
    return f"separate/quality/{probe.adapter_ref}/{probe.prompt}/{probe.expected}"


def _sweep_key(cell: CellTraffic) -> str:
    return f"separate/sweep/{cell.shape.prompt_tokens}/{cell.shape.output_tokens}"


def _run_job(ctx: BaselineContext, cell: CellTraffic, job: _Job, model: Path) -> None:
    """Start the merged model's server, time its first answer, judge the probes, sweep."""
    cache = measure.RunCache(cache_of(ctx))
    shape = cell.shape
    spec = ServerSpec(
        model,
        server_dir(ctx, "separate"),
        max_model_len(shape.prompt_tokens, shape.output_tokens, model),
    )
    vocab = vocab_size(read_manifest(ctx.assets_dir))
    with comparator_server(spec) as server:
        cold_s = first_answer_s(server, LoadSpec(1, 1, shape.prompt_tokens, 1, vocab, seed=0))
        cache.put(_COLD_STARTS, [*_cold_starts(cache), cold_s])
        for probe in job.probes:
            passed, _ = measure.judge(server, probe.prompt, probe.expected)
            cache.put(_quality_key(probe), passed)
        if job.probes:
            cache.put(_QUALITY_REFS, sorted({*_measured_refs(cache), job.ref}))
        if job.sweep:
            levels = measure.sweep(
                server, shape.prompt_tokens, shape.output_tokens, vocab, ctx.quick
            )
            record = {
                "adapter": job.ref,
                "levels": [measure.level_to_json(level) for level in levels],
                "peak_rss_bytes": peak_rss_bytes(server.pid),
                "cold_start_s": cold_s,
                "load_average_1m": os.getloadavg()[0],
            }
            cache.put(_sweep_key(cell), record)


def _cold_starts(cache: measure.RunCache) -> list[float]:
    raw = cache.get(_COLD_STARTS)
    return [float(x) for x in raw] if isinstance(raw, list) else []


def measure_separate(
    ctx: BaselineContext, cell: CellTraffic, *, scale_to_zero: bool = False
) -> MethodResult:
    """The cell's traffic on one merged model per adapter, measured and priced.
    ``scale_to_zero``: an adapter without traffic has no replica, and the first request of
    one with traffic pays the measured cold start against the TTFT objective."""
    assets = load_assets(ctx)
    jobs = _jobs(ctx, cell, assets)
    paths = {**cell.adapter_dirs, **{a.ref: a.path for a in assets.adapters}}
    # One merge subprocess for every model this cell needs (one torch and PEFT import).
    models = merged_models(
        assets.base_model_dir,
        {job.ref: paths[job.ref] for job in jobs},
        ctx.workdir / "merged-models",
    )
    for job in jobs:
        _run_job(ctx, cell, job, models[job.ref])
    cache = measure.RunCache(cache_of(ctx))
    raw = cache.get(_sweep_key(cell))
    if not isinstance(raw, dict):
        raise RuntimeError(f"no load sweep was recorded for {cell.shape.name}")
    levels = [measure.level_from_json(level) for level in raw["levels"]]
    judged: dict[Probe, bool | None] = {}
    for probe in cell.probes:
        passed = cache.get(_quality_key(probe))
        judged[probe] = passed if isinstance(passed, bool) else None
    footprint = Footprint(levels, int(raw["peak_rss_bytes"]), machine_memory_bytes())
    cold_start_s = statistics.median(_cold_starts(cache))
    result = price_separate(
        ctx.price, cell, footprint, cold_start_s, judged, scale_to_zero=scale_to_zero
    )
    result.terms.update(
        capacity_adapter=raw["adapter"],
        cold_start_samples_s=_cold_starts(cache),
        sweep_load_average_1m=raw["load_average_1m"],
    )
    return result
