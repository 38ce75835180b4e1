"""``loraplex bench sim``: the simulator side by side with real runs, and at scale.

1. A cost model: a file given (``--cost-model``), or a calibration of a fresh demo server
   (``loraplex sim calibrate --self``): controlled step mixes and cold loads, never the traces
   validated below, so the simulator is calibrated on other traffic than it is judged on.
2. Real runs (``validate.py``): each trace on a real single server and on a real fleet, each
   run right after the host-speed probe (``host_probe.py``), reported against the cost
   model's own (``host_report``; never applied to the prices: ``sim/host_speed.py``).
3. The same traces through ``simulate`` with a config mirroring the real settings
   (``simulated.py``); what the invocation runs is ``config.py``'s ``SimBenchConfig``.
4. Errors per target (``compare.py``), and the scale run (1M requests, 10k adapters, 64
   replicas) in a child process of its own, so its peak RSS is the simulator's alone.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from loraplex.bench.harness.machine import machine_record
from loraplex.bench.serve.driver import DriveConfig
from loraplex.bench.serve.fleet import Fleet
from loraplex.bench.sim.compare import (
    compare_target,
    flat_errors,
    flat_spreads,
    median_outcome,
    real_spread,
)
from loraplex.bench.sim.config import SimBenchConfig
from loraplex.bench.sim.fleet_interleaved import InterleavedFleet, fleet_pricing
from loraplex.bench.sim.interleaved import InterleavedCalibration, Pricing, interleaved_pricing
from loraplex.bench.sim.simulated import simulated
from loraplex.bench.sim.validate import MAX_LORA_RANK
from loraplex.bench.workloads import Workload
from loraplex.sim.cost_model import CostModel
from loraplex.sim.host_speed import HostProbe, probe_ratio


def prepared(
    config: SimBenchConfig, workloads: list[Workload], root: Path, model_dir: Path
) -> Fleet:
    """The registry every real run shares: each trace adapter, each tenant's class and quotas."""
    from loraplex.bench.serve.fleet import prepare_fleet

    union = {(a.tenant, a.name): a for w in workloads for a in w.adapters}
    adapters = list(union.values())
    return prepare_fleet(root / "registry", model_dir, adapters, MAX_LORA_RANK, config.seed)


Probes = dict[str, dict[str, list[HostProbe]]]  # target -> trace -> one per repeat


def real(
    config: SimBenchConfig, workloads: list[Workload], registry: Fleet, root: Path, vocab: int,
    *, probes: Probes | None = None, between: Callable[[], None] | None = None,
    run_order: list[tuple[str, str]] | None = None,
    fleet_passes: InterleavedFleet | None = None,
) -> dict[str, dict[str, list[dict[str, Any]]]]:  # fmt: skip
    """target -> trace -> each repeat's real outcome. A repeat runs every trace once, in trace
    order on even repeats and reversed on odd ones (ABBA), so no trace is always the first
    server of the invocation. ``probes``, when given, receives the host-speed probe timed right
    before each real run (``host_probe.py``); ``between`` is called before each real run and
    once after the last (an interleaved calibration's passes), ``run_order`` receives each run's
    (target, trace) in the order run; ``fleet_passes`` runs a fleet pass in the fleet's Ray
    cluster before each fleet run and once after the last (``fleet_interleaved.py``)."""
    from loraplex.bench.fleet.cluster import local_cluster
    from loraplex.bench.sim.host_probe import host_probe
    from loraplex.bench.sim.validate import RunLogs, fleet_outcome, single_outcome

    def probed(target: str, trace: str) -> None:
        if between is not None:
            between()
        if run_order is not None:
            run_order.append((target, trace))
        if probes is not None:
            probes.setdefault(target, {}).setdefault(trace, []).append(host_probe())

    s = config.settings
    drive = DriveConfig(request_timeout_s=s.request_timeout_s, vocab_size=vocab, seed=s.seed)
    out: dict[str, dict[str, list[dict[str, Any]]]] = {
        t: {w.name: [] for w in workloads} for t in config.targets
    }
    orders = [list(enumerate(workloads))[:: 1 if r % 2 == 0 else -1] for r in range(config.repeats)]
    if "single" in config.targets:
        for r, order in enumerate(orders):
            for i, w in order:
                where = root / f"single-{r}-{i}"
                logs = None
                if config.logs_dir is not None:
                    logs = RunLogs.under(config.logs_dir, f"single-r{r}-{w.name}")
                probed("single", w.name)
                outcome = single_outcome(registry, w, s, drive, where, logs=logs)
                out["single"][w.name].append(outcome)
    if "fleet" in config.targets:
        with local_cluster(1) as port:
            target = (registry, f"http://127.0.0.1:{port}", port)
            for r, order in enumerate(orders):
                for i, w in order:
                    where = root / f"fleet-{r}-{i}"
                    if fleet_passes is not None:
                        fleet_passes.run_pass(target, s, drive, root)
                    probed("fleet", w.name)
                    out["fleet"][w.name].append(fleet_outcome(target, w, s, drive, where))
            if fleet_passes is not None:
                fleet_passes.run_pass(target, s, drive, root)
    if between is not None:
        between()
    return out


def host_report(calibrated: HostProbe | None, probes: Probes) -> dict[str, Any]:
    """The calibration's host probe, every real run's, and per target and trace the median
    ratio of the run's probe over the calibration's (slower host > 1; None without a
    calibration probe). Reported only: no price is scaled by it (``sim/host_speed.py``)."""
    ratios: dict[str, dict[str, float | None]] = {}
    for target, by_trace in probes.items():
        ratios[target] = {
            trace: None
            if calibrated is None
            else round(statistics.median(probe_ratio(p, calibrated) for p in runs), 4)
            for trace, runs in by_trace.items()
        }
    return {
        "calibration": None if calibrated is None else asdict(calibrated),
        "runs": {
            t: {n: [asdict(p) for p in runs] for n, runs in v.items()} for t, v in probes.items()
        },
        "ratio": ratios,
    }


def priced(other: CostModel, fleet: Callable[[str], CostModel] | None = None) -> Pricing:
    """``other`` for every (target, trace); with ``fleet``, a fleet trace's model from it."""

    def price(target: str, trace: str) -> CostModel:
        return fleet(trace) if fleet is not None and target == "fleet" else other

    return price


def _medians(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    return {name: median_outcome(outcomes) for name, outcomes in runs.items()}


def _simulations(
    config: SimBenchConfig, workloads: list[Workload], registry: Fleet,
    reals: dict[str, dict[str, list[dict[str, Any]]]], order: list[tuple[str, str]], *,
    probes: Probes, cost_model: CostModel | None, interleaved: InterleavedCalibration | None,
    fleet_passes: InterleavedFleet | None,
) -> tuple[dict[str, Any], CostModel, dict[str, Any] | None, dict[str, Any] | None]:  # fmt: skip
    """The simulated side of every target (adjacent passes' pricing where passes ran), the
    whole cost model (the file's, or all single passes' merged), and the passes' reports with
    the errors under all passes' merged samples."""
    interleaved_report: dict[str, Any] | None = None
    if interleaved is not None:
        cost_model, pricing, interleaved_report = interleaved_pricing(interleaved, order)
    assert cost_model is not None  # checked above
    whole = cost_model
    whole_pricing = priced(whole)
    fleet_report: dict[str, Any] | None = None
    if fleet_passes is not None:
        fleet_order = [trace for target, trace in order if target == "fleet"]
        fleet_whole, fleet_models, fleet_report = fleet_pricing(
            fleet_passes, fleet_order, probes.get("fleet", {})
        )
        pricing = priced(whole, fleet_models.__getitem__)
        whole_pricing = priced(whole, lambda trace: fleet_whole)
    sims = simulated(config, workloads, whole_pricing, registry)
    report = interleaved_report if interleaved_report is not None else fleet_report
    if report is not None:  # the flat errors are the adjacent passes'
        sims, sims_all = simulated(config, workloads, pricing, registry), sims
        targets = config.targets if interleaved_report is not None else ("fleet",)
        by_all = {t: compare_target(_medians(reals[t]), sims_all[t], t) for t in targets}
        report["errors_all_passes"] = flat_errors(by_all)
        report["traces_all_passes"] = {
            t: {
                n: {"errors": v["errors"], "ttft_ms": v["sim"]["ttft_ms"]}
                for n, v in by["traces"].items()
            }
            for t, by in by_all.items()
        }
    return sims, cost_model, interleaved_report, fleet_report


def run_sim_bench(
    config: SimBenchConfig,
    cost_model: CostModel | None,
    interleaved: InterleavedCalibration | None = None,
    fleet_passes: InterleavedFleet | None = None,
) -> dict[str, Any]:
    """Real and simulated runs of every trace and target, their errors, and the scale run;
    priced by ``cost_model``, or with ``interleaved`` by passes run between the real runs, or
    with ``fleet_passes`` the fleet traces by ``cost_model`` with the fleet's lone terms of
    passes run around the fleet runs (the errors of both pricings reported; the flat keys are
    the adjacent passes')."""
    from loraplex.artifacts.base_model import BaseModelSpec
    from loraplex.bench.sim.scale import scale_in_child
    from loraplex.demo.assets import generate_demo_assets

    if (cost_model is None) == (interleaved is None):
        raise ValueError("expected a cost_model or an interleaved calibration, exactly one")
    if fleet_passes is not None and (cost_model is None or "fleet" not in config.targets):
        raise ValueError("fleet passes need a cost_model (their base) and the fleet target")
    assets = generate_demo_assets(config.asset_dir / "test-small", preset="small", seed=0)
    vocab = BaseModelSpec.from_dir(assets.base_model_dir).vocab_size
    workloads = config.workloads()
    with tempfile.TemporaryDirectory(prefix="loraplex-bench-sim-") as tmp:
        root = Path(tmp)
        registry = prepared(config, workloads, root, assets.base_model_dir)
        probes: Probes = {}
        order: list[tuple[str, str]] = []
        between = None if interleaved is None else interleaved.run_pass
        reals = real(
            config,
            workloads,
            registry,
            root,
            vocab,
            probes=probes,
            between=between,
            run_order=order,
            fleet_passes=fleet_passes,
        )
        sims, cost_model, interleaved_report, fleet_report = _simulations(
            config, workloads, registry, reals, order, probes=probes, cost_model=cost_model,
            interleaved=interleaved, fleet_passes=fleet_passes,
        )  # fmt: skip
    by_target = {t: compare_target(_medians(reals[t]), sims[t], t) for t in config.targets}
    spreads = {t: real_spread(reals[t]) for t in config.targets}
    for t in config.targets:
        by_target[t]["real_spread"] = spreads[t]
    metrics: dict[str, Any] = dict(flat_errors(by_target))
    metrics.update(flat_spreads(spreads))
    if config.scale is not None:
        metrics.update(scale_in_child(*config.scale, cost_model))
    metrics["cost_model"] = {"hardware": cost_model.hardware, "validated": cost_model.validated}
    metrics["host_probe"] = host_report(cost_model.host_probe, probes)
    metrics["calibration_interleaved"] = interleaved_report
    metrics["calibration_fleet_interleaved"] = fleet_report
    metrics["targets"] = by_target
    plain = asdict(config)
    plain["cost_model"] = None if config.cost_model is None else str(config.cost_model)
    plain["asset_dir"] = str(config.asset_dir)
    plain["logs_dir"] = None if config.logs_dir is None else str(config.logs_dir)
    plain["machine"] = machine_record()
    return {"name": "sim", "config": plain, "seed": config.seed, "metrics": metrics}
