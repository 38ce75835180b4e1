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
from dataclasses import asdict, dataclass
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
from loraplex.bench.workloads import Workload, adapter_union
from loraplex.sim.cost_model import CostModel
from loraplex.sim.host_speed import HostProbe, probe_ratio


def prepared(
    config: SimBenchConfig, workloads: list[Workload], root: Path, model_dir: Path
) -> Fleet:
    """The registry every real run shares: each trace adapter, each tenant's class and quotas."""
    from loraplex.bench.serve.fleet import prepare_fleet

    adapters = adapter_union(w.adapters for w in workloads)  # the first definition of each
    return prepare_fleet(root / "registry", model_dir, adapters, MAX_LORA_RANK, config.seed)


Probes = dict[str, dict[str, list[HostProbe]]]  # target -> trace -> one per repeat


def real(
    config: SimBenchConfig, workloads: list[Workload], registry: Fleet, root: Path, vocab: int,
    *, probes: Probes | None = None, between: Callable[[], None] | None = None,
    run_order: list[tuple[str, str]] | None = None,
    fleet_passes: InterleavedFleet | None = None, between_targets: tuple[str, ...] | None = None,
) -> dict[str, dict[str, list[dict[str, Any]]]]:  # fmt: skip
    """target -> trace -> each repeat's real outcome. A repeat runs every trace once, in trace
    order on even repeats and reversed on odd ones (ABBA), so no trace is always the first
    server of the invocation. ``probes``, when given, receives the host-speed probe timed right
    before each real run (``host_probe.py``); ``between`` is called before each real run and
    once after the last (an interleaved calibration's passes); with ``between_targets``, only
    around those targets' runs (the last call right after the last of them), ``run_order``
    receives each run's (target, trace) in the order run; ``fleet_passes`` runs a fleet pass in
    the fleet's Ray cluster before each fleet run and once after the last
    (``fleet_interleaved.py``)."""
    from loraplex.bench.fleet.cluster import local_cluster
    from loraplex.bench.sim.host_probe import host_probe
    from loraplex.bench.sim.validate import RunLogs, fleet_outcome, single_outcome

    around = config.targets if between_targets is None else between_targets
    last = "fleet" if "fleet" in around and "fleet" in config.targets else "single"

    def probed(target: str, trace: str) -> None:
        if between is not None and target in around:
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
    if between is not None and last == "single":
        between()
    if "fleet" in config.targets:
        with local_cluster(1) as port:
            target = (registry, f"http://127.0.0.1:{port}", port)
            for r, order in enumerate(orders):
                for i, w in order:
                    where = root / f"fleet-{r}-{i}"
                    if fleet_passes is not None:
                        fleet_passes.run_pass(target, s, drive, root)
                    client = None
                    if config.logs_dir is not None:
                        client = RunLogs.under(config.logs_dir, f"fleet-r{r}-{w.name}").client
                    probed("fleet", w.name)
                    outcome = fleet_outcome(target, w, s, drive, where, client_log=client)
                    out["fleet"][w.name].append(outcome)
            if fleet_passes is not None:
                fleet_passes.run_pass(target, s, drive, root)
    if between is not None and last == "fleet":
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


def priced(other: CostModel | Pricing, fleet: Callable[[str], CostModel] | None = None) -> Pricing:
    """``other`` for every (target, trace) (a model, or a pricing of its own); with ``fleet``, a
    fleet trace's model from it."""

    def price(target: str, trace: str) -> CostModel:
        if fleet is not None and target == "fleet":
            return fleet(trace)
        return other if isinstance(other, CostModel) else other(target, trace)

    return price


def _medians(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    return {name: median_outcome(outcomes) for name, outcomes in runs.items()}


@dataclass
class Pricings:
    """How every (target, trace) is simulated: by the passes around its runs (``adjacent``, the
    flat keys) and by all (kept) passes merged (``all_passes``), the whole cost model (the
    scale run's, ``metrics.cost_model``'s), and each passes' report with the targets it
    prices (the single passes': every target without a file, the single one with a file; the
    fleet passes': the fleet)."""

    adjacent: Pricing
    all_passes: Pricing
    whole: CostModel
    reports: list[tuple[dict[str, Any], tuple[str, ...]]]


def pricings(
    config: SimBenchConfig, order: list[tuple[str, str]], probes: Probes, *,
    cost_model: CostModel | None, interleaved: InterleavedCalibration | None,
    fleet_passes: InterleavedFleet | None,
) -> Pricings:  # fmt: skip
    """The pricings of ``run_sim_bench``'s inputs after the real runs (``order``: each run's
    (target, trace) in the order run). With both a file and single passes, the passes price the
    single target (their runs being the single ones) and the file the fleet, with the fleet
    passes' lone terms where they ran (refitted over the file's lone-server terms, which its
    ``fleet_contention`` was fitted with)."""
    reports: list[tuple[dict[str, Any], tuple[str, ...]]] = []
    if interleaved is None:
        assert cost_model is not None  # checked by run_sim_bench
        whole = cost_model
        adjacent = all_passes = priced(cost_model)
    else:
        passes_for = config.targets if cost_model is None else ("single",)
        runs = [pair for pair in order if pair[0] in passes_for]
        passes_whole, passes_pricing, report = interleaved_pricing(interleaved, runs)
        reports.append((report, passes_for))
        if cost_model is None:
            whole, adjacent, all_passes = passes_whole, passes_pricing, priced(passes_whole)
        else:
            whole = file_model = cost_model
            adjacent = priced(passes_pricing, lambda trace: file_model)
            all_passes = priced(passes_whole, lambda trace: file_model)
    if fleet_passes is not None:
        fleet_order = [trace for target, trace in order if target == "fleet"]
        fleet_whole, fleet_models, fleet_report = fleet_pricing(
            fleet_passes, fleet_order, probes.get("fleet", {})
        )
        reports.append((fleet_report, ("fleet",)))
        adjacent = priced(adjacent, fleet_models.__getitem__)
        all_passes = priced(all_passes, lambda trace: fleet_whole)
    return Pricings(adjacent, all_passes, whole, reports)


def _simulations(
    config: SimBenchConfig, workloads: list[Workload], registry: Fleet,
    reals: dict[str, dict[str, list[dict[str, Any]]]], prices: Pricings,
) -> dict[str, Any]:  # fmt: skip
    """The simulated side of every target (``prices.adjacent``), and in each passes' report
    the errors of its targets under all (kept) passes' merged samples."""
    sims = simulated(config, workloads, prices.adjacent, registry)
    sims_all = simulated(config, workloads, prices.all_passes, registry) if prices.reports else sims
    for report, targets in prices.reports:
        by_all = {t: compare_target(_medians(reals[t]), sims_all[t], t) for t in targets}
        report["errors_all_passes"] = flat_errors(by_all)
        report["traces_all_passes"] = {
            t: {
                n: {"errors": v["errors"], "ttft_ms": v["sim"]["ttft_ms"]}
                for n, v in by["traces"].items()
            }
            for t, by in by_all.items()
        }
    return sims


def run_sim_bench(
    config: SimBenchConfig,
    cost_model: CostModel | None,
    interleaved: InterleavedCalibration | None = None,
    fleet_passes: InterleavedFleet | None = None,
) -> dict[str, Any]:
    """Real and simulated runs of every trace and target, their errors, and the scale run;
    priced by ``cost_model``, or with ``interleaved`` by passes run between the real runs, or
    with both the single target by passes run around the single runs and the fleet by
    ``cost_model``; with ``fleet_passes`` the fleet traces by ``cost_model`` with the fleet's
    lone terms of passes run around the fleet runs (the errors of both pricings reported; the
    flat keys are the adjacent passes')."""
    from loraplex.artifacts.base_model import BaseModelSpec
    from loraplex.bench.sim.scale import scale_in_child
    from loraplex.demo.assets import generate_demo_assets

    if cost_model is None and interleaved is None:
        raise ValueError("expected a cost_model, an interleaved calibration, or both")
    both = {"single", "fleet"} <= set(config.targets)
    if cost_model is not None and interleaved is not None and not both:
        raise ValueError(
            "a cost_model with an interleaved calibration needs both targets: the passes "
            "price the single server, the file the fleet"
        )
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
            between_targets=None if cost_model is None else ("single",),
        )
        prices = pricings(
            config, order, probes, cost_model=cost_model, interleaved=interleaved,
            fleet_passes=fleet_passes,
        )  # fmt: skip
        sims = _simulations(config, workloads, registry, reals, prices)
    cost_model = prices.whole
    interleaved_report = None if interleaved is None else prices.reports[0][0]
    fleet_report = None if fleet_passes is None else prices.reports[-1][0]
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
