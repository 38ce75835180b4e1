"""``loraplex bench serve``: the real server over HTTP on the WORKLOADS.md traces.

Side by side in one invocation (fresh server and cold cache per run, the same trace):
hot-burst under lru, lru_priority (LRU within priority classes: the priority information
cost_aware also sees) and cost_aware at several slot counts; zipf-longtail under lru and
cost_aware; cold-storm with and without the storm tenant; HTTP vs in-process throughput (both
with the engine in its own process); and, when asked for, the adversarial scenario
(``serve_adversarial``: the steady tenants with and without an attacker tenant). Traces are
generated at a wall-clock scale and replayed open-loop. Their rate is, unless given, ``load``
times the server's measured capacity (completed trace-shaped requests per second at saturation,
measured first), and their length ``trace_requests`` at that rate: a faster or slower machine
then runs the same number of requests at the same utilisation, instead of idling or drowning at
a fixed rate.

Fairness between the runs compared (``serve_runs``): each comparison is repeated
``trace_repeats`` times with the order alternating (ABBA) and the repeats pooled per run; before
every run the artifact store's pages are dropped from the OS page cache, so no run fetches its
L3 objects from pages an earlier run warmed. Failed and timed-out requests count in the TTFT
percentiles at the timeout (``serve_summary``).
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from loraplex.bench.harness.machine import machine_record
from loraplex.bench.serve.adversarial import (
    ADVERSARIAL,
    AdversarialRun,
    adversarial_metrics,
    adversarial_workload,
    run_adversarial,
)
from loraplex.bench.serve.attack_report import kind_metrics
from loraplex.bench.serve.attack_runs import KindRun, run_attack_kinds
from loraplex.bench.serve.config import ServeBenchConfig
from loraplex.bench.serve.driver import DriveConfig
from loraplex.bench.serve.fleet import Fleet, ServerOptions, drop_page_cache, prepare_fleet
from loraplex.bench.serve.repeats import hot_burst_spread
from loraplex.bench.serve.runs import TracePlan, comparisons, trace_runs
from loraplex.bench.serve.share_arms import share_arm_metrics, with_arms
from loraplex.bench.serve.summary import RunResult, headline, summarize
from loraplex.bench.serve.throughput import ThroughputConfig, ThroughputResult, measure_throughput
from loraplex.bench.workloads import ScenarioParams, Workload, adapter_union, generate


def run_serve_bench(config: ServeBenchConfig) -> dict[str, Any]:
    """Every run of the benchmark; the result dict has name, config, seed, metrics, runs."""
    from loraplex.artifacts.base_model import BaseModelSpec
    from loraplex.demo.assets import generate_demo_assets

    assets = generate_demo_assets(config.asset_dir / "test-small", preset="small", seed=0)
    vocab = BaseModelSpec.from_dir(assets.base_model_dir).vocab_size
    # A trace's adapters do not depend on its rate or length: one draft names them all.
    draft = config.params(rate=1.0, duration_s=1.0)
    adapters = adapter_union(
        _generate(name, config.seed, draft).adapters for name in config.scenarios
    )
    throughput_adapters = tuple((a.tenant, a.name) for a in adapters[:8])
    drive = DriveConfig(
        request_timeout_s=config.request_timeout_s, vocab_size=vocab, seed=config.seed
    )
    with tempfile.TemporaryDirectory(prefix="loraplex-bench-serve-") as tmp:
        root = Path(tmp)
        fleet = prepare_fleet(
            root / "fleet", assets.base_model_dir, adapters, config.max_lora_rank, config.seed
        )
        tput_config = ThroughputConfig(
            throughput_adapters,
            config.throughput_requests,
            config.prompt_tokens,
            2 * config.output_tokens,
            config.throughput_rounds,
            vocab,
            config.seed,
            capacity_requests=config.capacity_requests,
            capacity_output_tokens=config.output_tokens,
        )
        tput = measure_throughput(
            fleet,
            root / "throughput",
            _options(config, "cost_aware", config.max_loras),
            tput_config,
        )
        rate, duration = config.trace_shape(tput.capacity)
        params = config.params(rate, duration)
        workloads = {name: _generate(name, config.seed, params) for name in config.scenarios}
        attack = workloads.pop(ADVERSARIAL, None)
        dropped = drop_page_cache(fleet.store)
        groups = comparisons(
            workloads,
            config.hot_burst_slots,
            config.max_loras,
            lambda policy, slots: _trace_options(config, policy, slots),
            config.hot_burst_candidates,
            baselines=config.hot_burst_baselines,
        )
        both = config.tier_share_by_priority == "both"  # then every group is hot-burst's
        plan = TracePlan(
            [with_arms(group) for group in groups] if both else groups,
            config.trace_repeats,
            config.request_timeout_s,
            config.logs_dir,
        )
        runs = trace_runs(plan, fleet, drive, root)
        hostile: list[AdversarialRun] = []
        isolated: list[KindRun] = []
        if attack is not None:
            hostile, isolated = _adversarial(config, fleet, root, attack, drive)
            timeout = config.request_timeout_s
            runs += [RunResult(r.name, r.records, r.residency, timeout) for r in hostile]
            runs += [RunResult(r.name, r.records, r.residency, timeout) for r in isolated]
    summaries = {run.name: summarize(run) for run in runs}
    metrics = _trace_metrics(config, runs, summaries, "hot-burst" in workloads)
    if hostile and attack is not None:
        metrics.update(adversarial_metrics(hostile, attack, config.request_timeout_s))
    if isolated and attack is not None:
        metrics["adversarial_kinds"] = kind_metrics(isolated, attack, config.request_timeout_s)
    metrics.update(_throughput_metrics(tput))
    metrics["trace_rate"] = round(rate, 2)
    metrics["trace_duration_s"] = round(duration, 2)
    metrics["page_cache_dropped_per_run"] = dropped
    metrics["runs"] = summaries
    plain = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()}
    plain["machine"] = machine_record()
    return {"name": "serve", "config": plain, "seed": config.seed, "metrics": metrics, "runs": runs}


def _throughput_metrics(tput: ThroughputResult) -> dict[str, Any]:
    """HTTP vs in-process throughput and the measured capacity, rounded for the report."""
    return {
        "http_over_offline_throughput": None if tput.ratio is None else round(tput.ratio, 3),
        "throughput_completed_ratio_http": _share(tput.http_completed, tput.http_requests),
        "throughput_completed_ratio_offline": _share(tput.offline_completed, tput.offline_requests),
        "http_tokens_per_s": [round(v, 1) for v in tput.http_tokens_per_s],
        "offline_tokens_per_s": [round(v, 1) for v in tput.offline_tokens_per_s],
        "throughput_http_failures": tput.http_failures,
        "capacity_rps": [round(v, 1) for v in tput.capacity_rps],
    }


def _trace_metrics(
    config: ServeBenchConfig,
    runs: list[RunResult],
    summaries: dict[str, dict[str, Any]],
    hot_burst: bool,
) -> dict[str, Any]:
    """The trace runs' headline (``headline``) and hot-burst's figures per repeat; under
    ``tier_share_by_priority`` "both" hot-burst's figures per arm instead, after the on / off
    ratios (``share_arms``: there is no plain hot-burst run)."""
    slots = config.hot_burst_slots if hot_burst else ()
    policies = (config.hot_burst_candidates, config.hot_burst_baselines)
    if config.tier_share_by_priority == "both":
        metrics = share_arm_metrics(runs, slots, *policies)
        metrics.update(headline(summaries, (), *policies))
        return metrics
    metrics = headline(summaries, slots, *policies)
    if slots:
        metrics["hot_burst_repeats"] = hot_burst_spread(runs, slots, *policies)
    return metrics


def _adversarial(
    config: ServeBenchConfig, fleet: Fleet, root: Path, workload: Workload, drive: DriveConfig
) -> tuple[list[AdversarialRun], list[KindRun]]:
    """The mixed attacker's runs, then each isolated kind's (those selected of each)."""
    options = _options(config, "cost_aware", config.max_loras)
    attack = config.adversarial
    hostile: list[AdversarialRun] = []
    isolated: list[KindRun] = []
    if attack.mixed_kinds:
        hostile = run_adversarial(
            fleet, root / ADVERSARIAL, workload, options=options, drive=drive, config=attack
        )
    if attack.isolated_kinds:
        isolated = run_attack_kinds(
            fleet, root / "kinds", workload, options=options, drive=drive, config=attack
        )
    return hostile, isolated


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _generate(name: str, seed: int, params: ScenarioParams) -> Workload:
    if name == ADVERSARIAL:
        return adversarial_workload(seed, params)
    return generate(name, seed, params)


def _trace_options(config: ServeBenchConfig, policy: str, max_loras: int) -> ServerOptions:
    """A trace run's server settings: ``_options`` with the benchmark's tier share settings."""
    return replace(
        _options(config, policy, max_loras),
        default_tenant_tier_share=config.tenant_tier_share,
        tier_share_by_priority=config.tier_share_by_priority == "on",
    )


def _options(config: ServeBenchConfig, policy: str, max_loras: int) -> ServerOptions:
    return ServerOptions(
        policy, max_loras, config.cpu_adapter_bytes, queue_deadline_s=config.request_timeout_s / 2
    )
