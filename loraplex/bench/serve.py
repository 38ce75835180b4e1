"""``loraplex bench serve``: the real server over HTTP on the WORKLOADS.md traces.

Side by side in one invocation (fresh server and cold cache per run, the same trace):
hot-burst and zipf-longtail under lru and cost_aware; cold-storm with and without the storm
tenant; HTTP vs in-process throughput; and, when asked for, the adversarial scenario
(``serve_adversarial``: the steady tenants with and without an attacker tenant). Traces are
generated at a wall-clock scale and replayed open-loop. Their rate is, unless given, ``load``
times the server's measured capacity (completed trace-shaped requests per second at saturation,
measured first), and their length ``trace_requests`` at that rate: a faster or slower machine
then runs the same number of requests at the same utilisation, instead of idling or drowning at
a fixed rate.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loraplex.bench.serve_adversarial import (
    ADVERSARIAL,
    AdversarialConfig,
    adversarial_metrics,
    adversarial_workload,
    run_adversarial,
)
from loraplex.bench.serve_driver import (
    TIERS,
    DriveConfig,
    RequestRecord,
    ResidencyView,
    replay_over_http,
)
from loraplex.bench.serve_fleet import Fleet, ServerOptions, prepare_fleet, serving
from loraplex.bench.serve_throughput import ThroughputConfig, measure_throughput
from loraplex.bench.workloads import (
    HOT_BURST_WINDOW,
    ScenarioParams,
    TraceAdapter,
    Workload,
    generate,
)
from loraplex.residency.stats import percentile

SCENARIOS = ("hot-burst", "zipf-longtail", "cold-storm")  # the default
KNOWN_SCENARIOS = (*SCENARIOS, ADVERSARIAL)  # adversarial is opt-in: it attacks the server
STEADY_TENANTS = ("steady-a", "steady-b")


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
    hot_burst_max_loras: int = 9  # hot-burst: the 8 hot adapters + 1
    cpu_adapter_bytes: int = 128 << 20  # L1 budget
    max_lora_rank: int = 64  # ranks above (WIDE's 128) are capped
    throughput_requests: int = 256  # requests per throughput round
    throughput_rounds: int = 4  # alternating rounds per side
    request_timeout_s: float = 60.0  # bound on every request
    seed: int = 0  # workload and weight seed
    asset_dir: Path = Path(".loraplex-assets")  # where the demo base model is generated / reused
    scenarios: tuple[str, ...] = field(default=SCENARIOS)  # subset of KNOWN_SCENARIOS
    adversarial: AdversarialConfig = field(default_factory=AdversarialConfig)  # its attacker

    def __post_init__(self) -> None:
        for name in ("load", "trace_requests", "prompt_tokens", "output_tokens", "num_adapters",
                     "max_loras", "hot_burst_max_loras", "cpu_adapter_bytes", "max_lora_rank",
                     "throughput_requests", "throughput_rounds", "request_timeout_s"):  # fmt: skip
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")
        for name in ("duration_s", "rate"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} {value} is invalid; expected > 0 or None (derived)")
        unknown = set(self.scenarios) - set(KNOWN_SCENARIOS)
        if unknown:
            raise ValueError(
                f"scenarios {sorted(unknown)} is invalid; expected from {KNOWN_SCENARIOS}"
            )

    def trace_shape(self, capacity_rps: float) -> tuple[float, float]:
        """(rate, duration_s) of the traces, given the measured capacity."""
        rate = self.rate if self.rate is not None else self.load * capacity_rps
        if not rate > 0:
            raise RuntimeError(f"measured capacity {capacity_rps} req/s leaves no trace rate")
        duration = self.duration_s if self.duration_s is not None else self.trace_requests / rate
        return rate, duration

    def params(self, rate: float, duration_s: float) -> ScenarioParams:
        return ScenarioParams(
            duration_s=duration_s, rate=rate, prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens, num_adapters=self.num_adapters,
        )  # fmt: skip


@dataclass(frozen=True)
class RunResult:
    """One server run: the records and the cache's view."""

    name: str  # e.g. "hot-burst/lru"
    records: tuple[RequestRecord, ...]  # one per trace request
    residency: ResidencyView  # tiers at arrival, hit series, final cache stats
    burst_start_s: float | None = None  # hot-burst: when the batch sweep starts


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
    drive = DriveConfig(request_timeout_s=config.request_timeout_s, vocab_size=vocab,
                        seed=config.seed)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="loraplex-bench-serve-") as tmp:
        root = Path(tmp)
        fleet = prepare_fleet(
            root / "fleet", assets.base_model_dir, adapters, config.max_lora_rank, config.seed
        )
        tput_config = ThroughputConfig(
            throughput_adapters, config.throughput_requests, config.prompt_tokens,
            2 * config.output_tokens, config.throughput_rounds, vocab, config.seed,
            capacity_output_tokens=config.output_tokens,
        )  # fmt: skip
        tput = measure_throughput(fleet, root / "throughput", _options(config, "cost_aware",
                                  config.max_loras), tput_config)  # fmt: skip
        rate, duration = config.trace_shape(tput.capacity)
        params = config.params(rate, duration)
        workloads = {name: _generate(name, config.seed, params) for name in config.scenarios}
        attack = workloads.pop(ADVERSARIAL, None)
        runs = _trace_runs(config, fleet, workloads, drive, root)
        hostile = []
        if attack is not None:
            options = _options(config, "cost_aware", config.max_loras)
            hostile = run_adversarial(fleet, root / ADVERSARIAL, attack, options=options,
                                      drive=drive, config=config.adversarial)  # fmt: skip
            runs += [RunResult(run.name, run.records, run.residency) for run in hostile]
    summaries = {run.name: summarize(run) for run in runs}
    metrics = headline(summaries)
    if attack is not None:
        metrics.update(adversarial_metrics(hostile, attack, config.request_timeout_s))
    metrics["http_over_offline_throughput"] = round(tput.ratio, 3)
    metrics["http_tokens_per_s"] = [round(v, 1) for v in tput.http_tokens_per_s]
    metrics["offline_tokens_per_s"] = [round(v, 1) for v in tput.offline_tokens_per_s]
    metrics["throughput_http_failures"] = tput.http_failures
    metrics["capacity_rps"] = [round(v, 1) for v in tput.capacity_rps]
    metrics["trace_rate"] = round(rate, 2)
    metrics["trace_duration_s"] = round(duration, 2)
    metrics["runs"] = summaries
    plain = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()}
    return {"name": "serve", "config": plain, "seed": config.seed, "metrics": metrics,
            "runs": runs}  # fmt: skip


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


def _options(config: ServeBenchConfig, policy: str, max_loras: int) -> ServerOptions:
    return ServerOptions(policy, max_loras, config.cpu_adapter_bytes,
                         queue_deadline_s=config.request_timeout_s / 2)  # fmt: skip


def _trace_runs(
    config: ServeBenchConfig,
    fleet: Fleet,
    workloads: dict[str, Workload],
    drive: DriveConfig,
    root: Path,
) -> list[RunResult]:
    plan: list[tuple[str, Workload, ServerOptions]] = []
    for name, workload in workloads.items():
        if name == "cold-storm":
            calm = [r for r in workload.requests if r.tenant != "storm"]
            quiet = Workload(workload.name, workload.seed, workload.duration_s,
                             workload.adapters, tuple(calm))  # fmt: skip
            options = _options(config, "cost_aware", config.max_loras)
            plan += [(f"{name}/storm", workload, options), (f"{name}/no-storm", quiet, options)]
            continue
        slots = config.hot_burst_max_loras if name == "hot-burst" else config.max_loras
        for policy in ("lru", "cost_aware"):
            plan.append((f"{name}/{policy}", workload, _options(config, policy, slots)))
    runs = []
    for index, (run_name, workload, options) in enumerate(plan):
        with serving(fleet, root / f"run-{index}", options) as url:
            records, view = asyncio.run(
                replay_over_http(url, workload.requests, fleet.keys, fleet.admin_key, drive)
            )
        burst = HOT_BURST_WINDOW[0] * workload.duration_s if workload.name == "hot-burst" else None
        runs.append(RunResult(run_name, tuple(records), view, burst))
    return runs


# --- summaries -------------------------------------------------------------------------------


def _ms(values: Sequence[float | None]) -> dict[str, float]:
    ordered = sorted(v * 1000 for v in values if v is not None)
    qs = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
    return {"n": len(ordered), **{k: round(percentile(ordered, q), 2) for k, q in qs.items()}}


def _grouped(
    records: Sequence[RequestRecord], group: Callable[[RequestRecord], str]
) -> dict[str, dict[str, Any]]:
    keys = sorted({group(r) for r in records})
    out = {}
    for key in keys:
        mine = [r for r in records if group(r) == key and r.ok]
        out[key] = {
            "ttft_ms": _ms([r.ttft_s for r in mine]),
            "tpot_ms": _ms([r.tpot_s for r in mine]),
            "tier_at_arrival": {t: sum(r.tier == t for r in mine) for t in TIERS},
        }
    return out


def hit_ratios(stats: dict[str, object]) -> dict[str, float]:
    """Fraction of adapter acquires served from each tier (L3: misses to the artifact store)."""
    hits = stats.get("hits")
    counts = {str(k): int(v) for k, v in hits.items()} if isinstance(hits, dict) else {}
    misses = stats.get("misses", 0)
    counts["L3"] = int(misses) if isinstance(misses, int) else 0
    total = sum(counts.values())
    return {t: round(counts.get(t, 0) / total, 4) if total else 0.0 for t in TIERS}


def summarize(run: RunResult) -> dict[str, Any]:
    records = run.records
    statuses: dict[str, int] = {}
    for r in records:
        label = str(r.status) if r.error is None or r.status != 200 else f"{r.status}-error"
        statuses[label] = statuses.get(label, 0) + 1
    arrival = {t: sum(r.tier == t for r in records) for t in TIERS}
    stats = run.residency.final
    warm = [r.ttft_s for r in records if r.ok and r.tier == "L0" and r.tenant in STEADY_TENANTS]
    return {
        "warm_p99_ttft_ms": _ms(warm)["p99"],
        "requests": len(records),
        "completed": sum(r.ok for r in records),
        "statuses": statuses,
        "tier_at_arrival": arrival,
        "hit_ratio": hit_ratios(stats),
        "thrash_ratio": _thrash(stats),
        "ttft_ms": _ms([r.ttft_s for r in records if r.ok]),
        "by_tier": _grouped(records, lambda r: r.tier),
        "by_tenant": _grouped(records, lambda r: r.tenant),
        **({} if run.burst_start_s is None else {
            "from_burst_by_tenant": _grouped(
                [r for r in records if r.t_s >= run.burst_start_s], lambda r: r.tenant
            ),
        }),
    }  # fmt: skip


def _thrash(stats: dict[str, object]) -> float:
    evictions, reloads = stats.get("evictions"), stats.get("reloads_after_eviction")
    if not isinstance(evictions, dict) or not isinstance(reloads, dict):
        return 0.0
    total = sum(int(v) for v in evictions.values())
    return round(sum(int(v) for v in reloads.values()) / total, 4) if total else 0.0


def _p99(summary: dict[str, Any], tenant: str, groups: str = "by_tenant") -> float:
    return float(summary[groups].get(tenant, {}).get("ttft_ms", {}).get("p99", 0.0))


def _in_l0(summary: dict[str, Any], tenant: str, groups: str = "by_tenant") -> float:
    """Share of ``tenant``'s completed requests whose adapter was in a GPU slot on arrival."""
    group = summary[groups].get(tenant)
    if not group or not group["ttft_ms"]["n"]:
        return 0.0
    return round(int(group["tier_at_arrival"]["L0"]) / int(group["ttft_ms"]["n"]), 4)


def _ratio(numerator: float, denominator: float) -> float:
    return round(numerator / denominator, 3) if denominator > 0 else 0.0


def headline(summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's three ratios plus the numbers they come from."""
    out: dict[str, Any] = {}
    lru, aware = summaries.get("hot-burst/lru"), summaries.get("hot-burst/cost_aware")
    if lru is not None and aware is not None:
        # WORKLOADS.md: the hot tenant "during and after the burst" (its cold start before the
        # sweep is the same for both policies), and over the whole run for reference.
        window = "from_burst_by_tenant"
        ratio = _ratio(_p99(lru, "prio", window), _p99(aware, "prio", window))
        out["hot_burst_p99_ttft_lru_over_cost_aware"] = ratio
        for label, summary in (("lru", lru), ("cost_aware", aware)):
            out[f"hot_burst_hot_p99_ttft_ms_{label}"] = _p99(summary, "prio", window)
            out[f"hot_burst_hot_in_l0_ratio_{label}"] = _in_l0(summary, "prio", window)
            out[f"hot_burst_hot_p99_ttft_ms_whole_run_{label}"] = _p99(summary, "prio")
            out[f"hot_burst_batch_p50_ttft_ms_{label}"] = float(
                summary["by_tenant"].get("batch", {}).get("ttft_ms", {}).get("p50", 0.0)
            )
    storm, calm = summaries.get("cold-storm/storm"), summaries.get("cold-storm/no-storm")
    if storm is not None and calm is not None:
        ratio = _ratio(storm["warm_p99_ttft_ms"], calm["warm_p99_ttft_ms"])
        out["storm_warm_p99_ttft_ratio"] = ratio
        for label, summary in (("storm", storm), ("no_storm", calm)):
            out[f"storm_warm_p99_ttft_ms_{label}"] = summary["warm_p99_ttft_ms"]
    for name, summary in summaries.items():
        prefix = name.replace("-", "_").replace("/", "_")
        out[f"{prefix}_l0_hit_ratio"] = summary["hit_ratio"]["L0"]
        out[f"{prefix}_completed_ratio"] = _ratio(summary["completed"], summary["requests"])
    return out
