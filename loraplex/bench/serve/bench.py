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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from loraplex.bench.harness.machine import machine_record
from loraplex.bench.serve.adversarial import (
    ADVERSARIAL,
    AdversarialConfig,
    AdversarialRun,
    adversarial_metrics,
    adversarial_workload,
    run_adversarial,
)
from loraplex.bench.serve.attack_report import kind_metrics
from loraplex.bench.serve.attack_runs import KindRun, run_attack_kinds
from loraplex.bench.serve.driver import DriveConfig
from loraplex.bench.serve.fleet import Fleet, ServerOptions, drop_page_cache, prepare_fleet
from loraplex.bench.serve.repeats import hot_burst_spread
from loraplex.bench.serve.runs import TracePlan, comparisons, trace_runs
from loraplex.bench.serve.share_arms import check_share_setting, share_arm_metrics, with_arms
from loraplex.bench.serve.summary import (
    HOT_BURST_BASELINES,
    HOT_BURST_CANDIDATES,
    RunResult,
    headline,
    summarize,
)
from loraplex.bench.serve.throughput import ThroughputConfig, measure_throughput
from loraplex.bench.workloads import (
    ScenarioParams,
    TraceAdapter,
    Workload,
    generate,
)
from loraplex.residency.ledger import check_tier_share
from loraplex.residency.policy import policy_names

# RunResult lives with the summaries; serve_report still imports it from here.
__all__ = ["KNOWN_SCENARIOS", "SCENARIOS", "RunResult", "ServeBenchConfig", "run_serve_bench"]

SCENARIOS = ("hot-burst", "zipf-longtail", "cold-storm")  # the default
KNOWN_SCENARIOS = (*SCENARIOS, ADVERSARIAL)  # adversarial is opt-in: it attacks the server


@dataclass(frozen=True)
class ServeBenchConfig:
    """What one benchmark invocation does."""

    duration_s: float | None = None  # wall seconds of each trace; None: trace_requests / rate
    rate: float | None = None  # mean requests per second of each trace; None: load x capacity
    load: float = 0.6  # trace rate as a fraction of the measured capacity (when rate is None)
    trace_requests: int = 720  # mean requests of a trace (when duration_s is None)
    prompt_tokens: int = 64  # prompt length of every request
    output_tokens: int = 16  # max tokens of every request
    num_adapters: int = 64  # zipf-longtail population and cold-storm's storm pool
    max_loras: int = 16  # GPU slots (zipf-longtail, cold-storm, throughput)
    # hot-burst's slot counts (the 8 hot adapters + 1, + 4, x 2); the first is the headline's
    hot_burst_slots: tuple[int, ...] = (9, 12, 16)
    # hot-burst: the policies measured against lru and lru_priority at every slot count
    hot_burst_candidates: tuple[str, ...] = HOT_BURST_CANDIDATES
    trace_repeats: int = 2  # runs of each trace comparison, order alternating (ABBA)
    cpu_adapter_bytes: int = 128 << 20  # L1 budget
    max_lora_rank: int = 64  # ranks above (WIDE's 128) are capped
    throughput_requests: int = 256  # requests per throughput round
    throughput_rounds: int = 4  # alternating rounds per side
    capacity_requests: int = 128  # requests per capacity round (HTTP, all at once)
    request_timeout_s: float = 60.0  # bound on every request
    seed: int = 0  # workload and weight seed
    asset_dir: Path = Path(".loraplex-assets")  # where the demo base model is generated / reused
    scenarios: tuple[str, ...] = field(default=SCENARIOS)  # subset of KNOWN_SCENARIOS
    adversarial: AdversarialConfig = field(default_factory=AdversarialConfig)  # its attacker
    # where each trace run keeps its server's request log and the client's records
    # (``runs.run_logs``); None: kept nowhere
    logs_dir: Path | None = None
    # the trace runs' ``default_tenant_tier_share``; None: the server's default (0.5)
    tenant_tier_share: float | None = None
    # the trace runs' ``tier_share_by_priority``: "off", "on", or "both" (each hot-burst run
    # with the rule off and on, ABBA: ``share_arms``)
    tier_share_by_priority: str = "off"
    # hot-burst: the baselines every candidate is measured against (lru and / or lru_priority)
    hot_burst_baselines: tuple[str, ...] = HOT_BURST_BASELINES

    def __post_init__(self) -> None:
        for name in (
            "load",
            "trace_requests",
            "prompt_tokens",
            "output_tokens",
            "num_adapters",
            "max_loras",
            "trace_repeats",
            "cpu_adapter_bytes",
            "max_lora_rank",
            "throughput_requests",
            "throughput_rounds",
            "capacity_requests",
            "request_timeout_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")
        for name in ("duration_s", "rate"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} {value} is invalid; expected > 0 or None (derived)")
        if not self.hot_burst_slots or min(self.hot_burst_slots) < 1:
            raise ValueError(
                f"hot_burst_slots {self.hot_burst_slots} is invalid; expected slot counts >= 1"
            )
        known = set(policy_names()) - set(HOT_BURST_BASELINES)
        candidates = self.hot_burst_candidates
        if not candidates or len(set(candidates)) != len(candidates) or set(candidates) - known:
            raise ValueError(
                f"hot_burst_candidates {list(candidates)} is invalid; expected distinct names "
                f"from {sorted(known)} (lru and lru_priority always run as the baselines)"
            )
        unknown = set(self.scenarios) - set(KNOWN_SCENARIOS)
        if unknown:
            raise ValueError(
                f"scenarios {sorted(unknown)} is invalid; expected from {KNOWN_SCENARIOS}"
            )
        if self.tenant_tier_share is not None:
            check_tier_share(self.tenant_tier_share, "tenant_tier_share")
        self._check_share_arms()
        if self.logs_dir is not None and not set(self.scenarios) & set(SCENARIOS):
            raise ValueError(
                f"logs_dir {self.logs_dir} is invalid; only the trace runs ({SCENARIOS}) keep "
                f"logs, and scenarios {list(self.scenarios)} has none"
            )

    def _check_share_arms(self) -> None:
        baselines = self.hot_burst_baselines
        if not baselines or len(set(baselines)) != len(baselines):
            raise ValueError(
                f"hot_burst_baselines {list(baselines)} is invalid; expected distinct names "
                f"from {list(HOT_BURST_BASELINES)} (other policies are candidates)"
            )
        if set(baselines) - set(HOT_BURST_BASELINES):
            raise ValueError(
                f"hot_burst_baselines {list(baselines)} is invalid; expected names from "
                f"{list(HOT_BURST_BASELINES)} (other policies are candidates)"
            )
        check_share_setting(self.tier_share_by_priority, self.scenarios, SCENARIOS)

    def trace_shape(self, capacity_rps: float | None) -> tuple[float, float]:
        """(rate, duration_s) of the traces, given the measured capacity (None: unmeasured)."""
        rate = self.rate if self.rate is not None else self.load * (capacity_rps or 0.0)
        if not rate > 0:
            raise RuntimeError(f"measured capacity {capacity_rps} req/s leaves no trace rate")
        duration = self.duration_s if self.duration_s is not None else self.trace_requests / rate
        return rate, duration

    def params(self, rate: float, duration_s: float) -> ScenarioParams:
        return ScenarioParams(
            duration_s=duration_s,
            rate=rate,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            num_adapters=self.num_adapters,
        )


def run_serve_bench(config: ServeBenchConfig) -> dict[str, Any]:
    """Every run of the benchmark; the result dict has name, config, seed, metrics, runs."""
    from loraplex.artifacts.base_model import BaseModelSpec
    from loraplex.demo.assets import generate_demo_assets

    assets = generate_demo_assets(config.asset_dir / "test-small", preset="small", seed=0)
    vocab = BaseModelSpec.from_dir(assets.base_model_dir).vocab_size
    # A trace's adapters do not depend on its rate or length: one draft names them all.
    draft = config.params(rate=1.0, duration_s=1.0)
    adapters = _union(_generate(name, config.seed, draft).adapters for name in config.scenarios)
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
    metrics["http_over_offline_throughput"] = None if tput.ratio is None else round(tput.ratio, 3)
    metrics["throughput_completed_ratio_http"] = _share(tput.http_completed, tput.http_requests)
    metrics["throughput_completed_ratio_offline"] = _share(
        tput.offline_completed, tput.offline_requests
    )
    metrics["http_tokens_per_s"] = [round(v, 1) for v in tput.http_tokens_per_s]
    metrics["offline_tokens_per_s"] = [round(v, 1) for v in tput.offline_tokens_per_s]
    metrics["throughput_http_failures"] = tput.http_failures
    metrics["capacity_rps"] = [round(v, 1) for v in tput.capacity_rps]
    metrics["trace_rate"] = round(rate, 2)
    metrics["trace_duration_s"] = round(duration, 2)
    metrics["page_cache_dropped_per_run"] = dropped
    metrics["runs"] = summaries
    plain = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()}
    plain["machine"] = machine_record()
    return {"name": "serve", "config": plain, "seed": config.seed, "metrics": metrics, "runs": runs}


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


def _union(groups: Any) -> tuple[TraceAdapter, ...]:
    seen: dict[tuple[str, str], TraceAdapter] = {}
    for group in groups:
        for adapter in group:
            seen.setdefault((adapter.tenant, adapter.name), adapter)
    return tuple(seen.values())


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
