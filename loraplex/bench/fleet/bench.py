"""``loraplex bench fleet``: the routing policies side by side on a real fleet.

One invocation holds one local Ray cluster (``fleet_cluster``) and one registry with every trace
adapter (``serve_fleet.prepare_fleet``, as ``bench serve`` prepares it). For each trace
(WORKLOADS.md's ``zipf-longtail`` and ``hot-burst``; ``hot-one``) and each routing policy, a
fresh fleet is deployed (``replicas`` engine replicas with small slot pools and fresh caches, so
every policy starts cold), an unmeasured warm-up of the trace's steady traffic brings it to a
steady state (``warmup_workload``), the trace is replayed through the ingress's HTTP API
(``fleet_drive``), the replicas' cache counters and the router's decisions over the replay alone
are read, and the fleet is deleted.

Fairness: every policy replays the same trace with the same prompts against the same fleet
settings, timed by the same client clock; the policies run ``repeats`` times in alternating order
(ABCD, then DCBA; the next trace starts the other way round) and each figure is the median over
the repeats, with its min and max (``fleet_repeats``); before
each run the artifact store's pages are dropped from the OS page cache (``drop_page_cache``).

Trace rate: unless given, ``load`` times the fleet's capacity, measured first on a fleet of its
own (Ray Serve's default router, adapters resident), and for ``hot-one`` the rate at which its
hot revision asks ``hot_load`` replicas' worth (``trace_rates``); the trace length is
``trace_requests`` at that rate, so a faster machine runs as many requests at the same
utilisation.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from loraplex.bench.fleet.config import (
    MAX_LORA_RANK,
    QUICK_SETTINGS,
    FleetBenchConfig,
    trace_rates,
)
from loraplex.bench.fleet.drive import capacity_batch, measure_capacity, median_or_none, replay
from loraplex.bench.fleet.report import (
    PolicyRun,
    ReplicaCounters,
    counters_since,
    decisions_since,
    fleet_metrics,
)
from loraplex.bench.harness.machine import machine_record
from loraplex.bench.harness.order import run_order
from loraplex.bench.serve.driver import DriveConfig
from loraplex.bench.serve.fleet import (
    Fleet,
    ServerOptions,
    drop_page_cache,
    prepare_fleet,
    serve_values,
)
from loraplex.bench.workloads import (
    HOT_BURST_SWEEP_TENANT,
    Workload,
    adapter_union,
    generate,
)
from loraplex.fleet.settings import FleetSettings
from loraplex.residency.policy import DEFAULT_POLICY as EVICTION_POLICY
from loraplex.router.router import DEFAULT_POLICY as DEFAULT_ROUTING_POLICY
from loraplex.serve.config import merge

__all__ = ["QUICK_SETTINGS", "FleetBenchConfig", "run_fleet_bench", "run_plan", "trace_rates"]
CAPACITY_POLICY = "pow2"  # Ray Serve's default router measures the capacity
RAY_CPUS = 1  # logical CPUs of the cluster: every deployment asks for 0, Ray prestarts fewer


@dataclass(frozen=True)
class FleetTarget:
    """Where the runs go: the prepared registry, the ingress URL, a scratch directory."""

    registry: Fleet  # every trace adapter, keys, the admin key
    url: str  # the ingress (its own listener, fleet/listener.py)
    port: int  # its port
    root: Path  # per-run data directories go under it


def run_fleet_bench(config: FleetBenchConfig) -> dict[str, Any]:
    """Every run of the benchmark; the result has name, config, seed, metrics and runs."""
    from loraplex.artifacts.base_model import BaseModelSpec
    from loraplex.bench.fleet.cluster import local_cluster
    from loraplex.demo.assets import generate_demo_assets

    assets = generate_demo_assets(config.asset_dir / "test-small", preset="small", seed=0)
    vocab = BaseModelSpec.from_dir(assets.base_model_dir).vocab_size
    # A trace's adapters do not depend on its rate or length: one draft names them all.
    drafts = [generate(name, config.seed, config.params(1.0, 1.0)) for name in config.traces]
    drive = DriveConfig(
        request_timeout_s=config.request_timeout_s, vocab_size=vocab, seed=config.seed
    )
    with tempfile.TemporaryDirectory(prefix="loraplex-bench-fleet-") as tmp:
        root = Path(tmp)
        registry = prepare_fleet(
            root / "registry",
            assets.base_model_dir,
            adapter_union(d.adapters for d in drafts),
            MAX_LORA_RANK,
            config.seed,
        )
        with local_cluster(RAY_CPUS) as port:
            target = FleetTarget(registry, f"http://127.0.0.1:{port}", port, root)
            capacity: tuple[float, ...] = ()
            if config.rate is None:
                hot = [(a.tenant, a.name) for a in drafts[0].adapters[: config.max_loras]]
                capacity = _capacity(config, target, hot, drive)
            rates = trace_rates(config, median_or_none(capacity))
            workloads = [
                generate(name, config.seed, config.params(rate, config.trace_requests / rate))
                for name, rate in rates.items()
            ]
            warmups = {name: warmup_workload(name, config, rate) for name, rate in rates.items()}
            runs, order = _policy_runs(config, target, workloads, warmups, drive)
    metrics = fleet_metrics(runs, config.traces, config.policies, config.request_timeout_s)
    metrics["capacity_rps"] = [round(v, 2) for v in capacity]
    metrics["trace_rate"] = {name: round(rate, 3) for name, rate in rates.items()}
    metrics["trace_duration_s"] = {w.name: round(w.duration_s, 2) for w in workloads}
    metrics["run_order"] = order
    return {
        "name": "fleet",
        "config": {**config.plain(), "machine": machine_record()},
        "seed": config.seed,
        "metrics": metrics,
        "runs": runs,
    }


def warmup_workload(name: str, config: FleetBenchConfig, rate: float) -> Workload | None:
    """The unmeasured traffic before trace ``name``: its steady part (zipf-longtail as it is,
    hot-burst without the batch tenant's sweep) at the trace's rate, for ``warmup_requests``
    requests on average, from another seed (other arrivals and picks than the measured trace).
    None when ``warmup_requests`` is 0."""
    if config.warmup_requests == 0:
        return None
    params = config.params(rate, config.warmup_requests / rate)
    workload = generate(name, config.seed + 1, params)
    steady = tuple(r for r in workload.requests if r.tenant != HOT_BURST_SWEEP_TENANT)
    return replace(workload, requests=steady)


class DeploymentShape(Protocol):
    """What a benchmark's config says of each fleet it deploys."""

    @property
    def replicas(self) -> int: ...
    @property
    def max_loras(self) -> int: ...
    @property
    def cpu_adapter_bytes(self) -> int: ...
    @property
    def request_timeout_s(self) -> float: ...
    @property
    def torch_threads(self) -> int: ...
    @property
    def seed(self) -> int: ...


def deployment_settings(
    config: DeploymentShape,
    target: FleetTarget,
    data_dir: Path,
    *,
    policy: str = DEFAULT_ROUTING_POLICY,
    mode: str = "unmerged",
    topology: dict[str, Any] | None = None,
) -> FleetSettings:
    """One deployment's settings: ``config.replicas`` engine replicas of the prepared registry
    with fresh caches under ``data_dir``, queue deadline half the request timeout, routing
    ``policy``, execution ``mode`` (ServeConfig's) and ``[fleet] topology`` (None: off)."""
    options = ServerOptions(
        EVICTION_POLICY,
        config.max_loras,
        config.cpu_adapter_bytes,
        queue_deadline_s=config.request_timeout_s / 2,
        torch_threads=config.torch_threads,
    )
    values = serve_values(target.registry, data_dir, options, target.port)
    values["mode"] = mode
    return FleetSettings(
        serve=merge({}, values),
        model_dir=target.registry.model_dir,
        engine_replicas=config.replicas,
        policy=policy,
        seed=config.seed,
        topology=topology,
    )


def _capacity(
    config: FleetBenchConfig,
    target: FleetTarget,
    adapters: list[tuple[str, str]],
    drive: DriveConfig,
) -> tuple[float, ...]:
    from loraplex.bench.fleet.cluster import deployed

    settings = deployment_settings(config, target, target.root / "capacity", policy=CAPACITY_POLICY)
    batch = capacity_batch(
        adapters, config.capacity_requests, config.prompt_tokens, config.output_tokens
    )
    with deployed(settings, target.url, target.registry.admin_key):
        keys = target.registry.keys
        return measure_capacity(target.url, batch, keys, drive, config.capacity_rounds)


def _policy_runs(
    config: FleetBenchConfig,
    target: FleetTarget,
    workloads: list[Workload],
    warmups: Mapping[str, Workload | None],
    drive: DriveConfig,
) -> tuple[list[PolicyRun], list[str]]:
    """Every (trace, policy) run in ``run_plan`` order; the runs and that order by name. Each
    run's counters and decisions are those of its measured replay (less the warm-up's)."""
    from loraplex.bench.fleet.cluster import deployed, fleet_state, settled_counters

    runs, names = [], []
    by_name = {w.name: w for w in workloads}
    plan = run_plan(tuple(by_name), config.policies, config.repeats)
    for index, (trace, policy) in enumerate(plan):
        workload = by_name[trace]
        names.append(f"{trace}/{policy}")
        settings = deployment_settings(config, target, target.root / f"run-{index}", policy=policy)
        drop_page_cache(target.registry.store)
        admin_key = target.registry.admin_key
        keys = target.registry.keys
        with deployed(settings, target.url, admin_key):
            before: tuple[ReplicaCounters, ...] = ()
            decided: dict[str, int] = {}
            warmup = warmups.get(trace)
            if warmup is not None:
                warm_drive = replace(drive, seed=drive.seed + 1)
                asyncio.run(replay(target.url, warmup.requests, keys, warm_drive))
                before = settled_counters(config.replicas, time.monotonic())
                decided = fleet_state(target.url, admin_key)["decisions"]
            records = asyncio.run(replay(target.url, workload.requests, keys, drive))
            counters = counters_since(settled_counters(config.replicas, time.monotonic()), before)
            decisions = decisions_since(fleet_state(target.url, admin_key)["decisions"], decided)
        runs.append(PolicyRun(workload.name, policy, tuple(records), counters, decisions))
    return runs, names


def run_plan(
    traces: tuple[str, ...], policies: tuple[str, ...], repeats: int
) -> list[tuple[str, str]]:
    """(trace, policy) in run order: each trace's policies ``repeats`` times, forward (ABCD)
    and backward (DCBA) in turn, the next trace starting the other way round
    (``serve_runs.run_order``), so drift on the shared machine favours no policy."""
    order = run_order([len(policies)] * len(traces), repeats)
    return [(traces[group], policies[member]) for group, member in order]
