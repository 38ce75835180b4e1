"""``loraplex bench sim``: the simulator side by side with real runs, and at scale.

1. A cost model: a file given (``--cost-model``), or a calibration of a fresh demo server
   (``loraplex sim calibrate --self``): controlled step mixes and cold loads, never the traces
   validated below, so the simulator is calibrated on other traffic than it is judged on.
2. Real runs (``validate.py``): each trace on a real single server and on a real fleet, each
   run right after the host-speed probe (``host_probe.py``), reported against the cost
   model's own (``host_report``; never applied to the prices: ``sim/host_speed.py``).
3. The same traces through ``simulate`` with a config mirroring the real settings.
4. Errors per target (``compare.py``), and the scale run (1M requests, 10k adapters, 64
   replicas) in a child process of its own, so its peak RSS is the simulator's alone.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
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
from loraplex.bench.sim.interleaved import InterleavedCalibration, Pricing, interleaved_pricing
from loraplex.bench.sim.validate import MAX_LORA_RANK, RealSettings
from loraplex.bench.workloads import (
    ScenarioParams,
    TraceAdapter,
    Workload,
    generate,
    trace_params,
)
from loraplex.engine.tenant_shares import TenantSettings
from loraplex.serve.config import ServeConfig
from loraplex.sim.cost_model import CostModel
from loraplex.sim.host_speed import HostProbe, probe_ratio

TRACES = ("zipf-longtail", "hot-burst", "cold-storm")
TARGETS = ("single", "fleet")
SCALE = (1_000_000, 10_000, 64)  # requests, adapters, replicas (issue 30)
BYTES_PER_PARAM = 4  # the demo server serves float32
# The server's defaults the real runs keep and the simulator's own defaults differ from.
SERVED_DEFAULTS = {f.name: f.default for f in fields(ServeConfig)}


@dataclass(frozen=True)
class SimBenchConfig:
    """What one ``bench sim`` invocation runs."""

    traces: tuple[str, ...] = TRACES  # validated traces
    targets: tuple[str, ...] = TARGETS  # single server, fleet
    trace_requests: int = 96  # mean requests per trace
    repeats: int = 1  # real runs of each (target, trace); compared by their median
    rate: float = 2.0  # mean requests per second
    num_adapters: int = 32  # zipf-longtail's population, cold-storm's storm pool
    prompt_tokens: int = 16  # per request
    output_tokens: int = 8  # per request
    settings: RealSettings = field(default_factory=RealSettings)  # both sides' deployment
    cost_model: Path | None = None  # None: calibrate a fresh demo server first
    scale: tuple[int, int, int] | None = SCALE  # (requests, adapters, replicas); None: skip
    seed: int = 0  # workloads, prompts, router
    asset_dir: Path = Path(".loraplex-assets")  # the demo base model is <dir>/test-small
    # where each real single-server run keeps its server's request log and the client's
    # records (``validate.RunLogs``); None: kept nowhere
    logs_dir: Path | None = None
    # K > 0: the in-run calibration as short passes of 1/K of its samples, one before each real
    # run and one after the last (``interleaved.py``); 0: one calibration before the runs
    calibrate_interleaved: int = 0

    def __post_init__(self) -> None:
        unknown = [t for t in self.traces if t not in TRACES]
        if not self.traces or unknown:
            raise ValueError(f"traces {list(self.traces)} is invalid; expected from {TRACES}")
        wrong = [t for t in self.targets if t not in TARGETS]
        if not self.targets or wrong:
            raise ValueError(f"targets {list(self.targets)} is invalid; expected from {TARGETS}")
        self.params()  # raises ValueError naming a bad field
        if self.repeats < 1:
            raise ValueError(f"repeats {self.repeats} is invalid; expected >= 1")
        if self.scale is not None and min(self.scale) < 1:
            raise ValueError(f"scale {self.scale} is invalid; expected three counts >= 1")
        if self.calibrate_interleaved < 0:
            raise ValueError(
                f"calibrate_interleaved {self.calibrate_interleaved} is invalid; expected >= 0"
            )
        if self.calibrate_interleaved and self.cost_model is not None:
            raise ValueError(
                f"calibrate_interleaved {self.calibrate_interleaved} is invalid with cost_model "
                f"{self.cost_model}: it interleaves the in-run calibration, which a file replaces"
            )
        if self.logs_dir is not None and "single" not in self.targets:
            raise ValueError(
                f"logs_dir {self.logs_dir} is invalid; only the single target's real runs keep "
                f"logs, and targets are {list(self.targets)}"
            )

    def params(self) -> ScenarioParams:
        return trace_params(
            self.trace_requests, self.rate, self.prompt_tokens, self.output_tokens,
            self.num_adapters,
        )  # fmt: skip

    def workloads(self) -> list[Workload]:
        params = self.params()
        return [generate(name, self.seed, params) for name in self.traces]


def sim_config(
    config: SimBenchConfig,
    target: str,
    bytes_per_rank: int,
    tenants: Mapping[str, TenantSettings],
) -> dict[str, Any]:
    """SimConfig fields mirroring the real deployment of ``target``: its settings, the server's
    defaults where the simulator's differ (context length, KV blocks), and ``tenants`` as the
    server's engine reads them from the registry (priority classes, quotas)."""
    s = config.settings
    return {
        "replicas": s.replicas if target == "fleet" else 1,
        "eviction_policy": "cost_aware",
        "max_loras": s.max_loras,
        "max_lora_rank": MAX_LORA_RANK,
        "bytes_per_rank": bytes_per_rank,
        "cpu_adapter_bytes": s.cpu_adapter_bytes,
        "max_num_seqs": s.max_num_seqs,
        "max_model_len": SERVED_DEFAULTS["max_model_len"],
        "num_kv_blocks": SERVED_DEFAULTS["num_kv_blocks"],
        "queue_deadline_s": s.request_timeout_s / 2,
        "timeout_s": s.request_timeout_s,
        "seed": s.seed,
        "tenants": dict(tenants),
    }


def registry_tenants(registry: Fleet) -> dict[str, TenantSettings]:
    """Every tenant's settings as a server on ``registry`` hands them to its engine."""
    from loraplex.registry import RegistryConfig, open_registry
    from loraplex.serve.engine_settings import tenant_settings

    where = RegistryConfig(registry.root, registry.database_url, str(registry.store))
    opened = open_registry(where)
    try:
        return tenant_settings(opened)
    finally:
        opened.close()


def adapter_sizes(
    model_dir: Path, adapters: list[TraceAdapter]
) -> tuple[dict[tuple[str, str], int], int]:
    """Each adapter's bytes as served (float32, rank capped) and the slot bytes per rank."""
    from loraplex.artifacts.base_model import TARGET_MODULES, BaseModelSpec, lora_bytes

    spec = BaseModelSpec.from_dir(model_dir)
    sizes = {
        (a.tenant, a.name): lora_bytes(spec, min(a.rank, MAX_LORA_RANK), BYTES_PER_PARAM, a.targets)
        for a in adapters
    }
    return sizes, lora_bytes(spec, 1, BYTES_PER_PARAM, TARGET_MODULES)


def simulated(
    config: SimBenchConfig, workloads: list[Workload], pricing: Pricing, registry: Fleet
) -> dict[str, dict[str, Any]]:
    """target -> trace -> the simulator's metrics, each priced by ``pricing``."""
    from loraplex.bench.sim.traces import workload_rows
    from loraplex.sim.call import records, simulate_metrics

    adapters = [a for w in workloads for a in w.adapters]
    sizes, per_rank = adapter_sizes(registry.model_dir, adapters)
    tenants = registry_tenants(registry)
    out: dict[str, dict[str, Any]] = {}
    for target in config.targets:
        values = sim_config(config, target, per_rank, tenants)
        out[target] = {
            w.name: simulate_metrics(
                records(workload_rows(w, MAX_LORA_RANK, sizes)), values, pricing(target, w.name)
            )
            for w in workloads
        }
    return out


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
) -> dict[str, dict[str, list[dict[str, Any]]]]:  # fmt: skip
    """target -> trace -> each repeat's real outcome. A repeat runs every trace once, in trace
    order on even repeats and reversed on odd ones (ABBA), so no trace is always the first
    server of the invocation. ``probes``, when given, receives the host-speed probe timed right
    before each real run (``host_probe.py``); ``between`` is called before each real run and
    once after the last (an interleaved calibration's passes), ``run_order`` receives each run's
    (target, trace) in the order run."""
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
                    probed("fleet", w.name)
                    out["fleet"][w.name].append(fleet_outcome(target, w, s, drive, where))
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


def _medians(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    return {name: median_outcome(outcomes) for name, outcomes in runs.items()}


def run_sim_bench(
    config: SimBenchConfig,
    cost_model: CostModel | None,
    interleaved: InterleavedCalibration | None = None,
) -> dict[str, Any]:
    """Real and simulated runs of every trace and target, their errors, and the scale run;
    priced by ``cost_model``, or with ``interleaved`` by passes run between the real runs
    (the errors of both pricings reported; the flat keys are the adjacent passes')."""
    from loraplex.artifacts.base_model import BaseModelSpec
    from loraplex.bench.sim.scale import scale_in_child
    from loraplex.demo.assets import generate_demo_assets

    if (cost_model is None) == (interleaved is None):
        raise ValueError("expected a cost_model or an interleaved calibration, exactly one")
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
        )
        interleaved_report: dict[str, Any] | None = None
        if interleaved is not None:
            cost_model, pricing, interleaved_report = interleaved_pricing(interleaved, order)
        assert cost_model is not None  # checked above
        whole = cost_model
        sims = simulated(config, workloads, lambda target, trace: whole, registry)
        if interleaved_report is not None:  # the flat errors are the adjacent passes'
            sims, sims_all = simulated(config, workloads, pricing, registry), sims
            by_all = {t: compare_target(_medians(reals[t]), sims_all[t], t) for t in config.targets}
            interleaved_report["errors_all_passes"] = flat_errors(by_all)
            interleaved_report["traces_all_passes"] = {
                t: {
                    n: {"errors": v["errors"], "ttft_ms": v["sim"]["ttft_ms"]}
                    for n, v in by["traces"].items()
                }
                for t, by in by_all.items()
            }
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
    metrics["targets"] = by_target
    plain = asdict(config)
    plain["cost_model"] = None if config.cost_model is None else str(config.cost_model)
    plain["asset_dir"] = str(config.asset_dir)
    plain["logs_dir"] = None if config.logs_dir is None else str(config.logs_dir)
    plain["machine"] = machine_record()
    return {"name": "sim", "config": plain, "seed": config.seed, "metrics": metrics}
