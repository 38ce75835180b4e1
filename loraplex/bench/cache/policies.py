"""``loraplex bench residency``: every eviction policy side by side on the cache replays.

Torch-free and machine-independent: the real ``TieredAdapterCache`` runs in simulated time
(``bench/replay.py``) with fixed stage costs (``StageCosts`` defaults, not measured), so a
figure here is a property of the policy and the trace, not of the machine or its load. Each
scenario runs ``repeats`` seeds; within a seed the policies run in alternating order (ABBA by
seed; in simulated time order cannot matter, it is kept for symmetry with ``bench serve``).
Every figure is the median over seeds with its min and max.

Per policy and trace: the share of requests served from L0, from L0 or L1 (the CPU tier's
cumulative hit ratio) and L1's local hit ratio (hits in L1 over lookups that missed L0);
reloads after eviction per 1k requests per tier; each tenant's P50/P99 wait for its lease
(arrival to lease, the replay's stand-in for the residency part of TTFT); on drift, how long
after each rotation of the hot set the L0 hit ratio takes to come back to within 5 pp of that
phase's steady state, as a fraction of the rotation period.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.bench.cache.belady import optimal_reloads
from loraplex.bench.cache.replays import REPLAY_PRIORITY
from loraplex.bench.cache.tier_floor import tier_floors
from loraplex.bench.harness.stats import median_min_max
from loraplex.bench.harness.stats import ratio as rounded_ratio
from loraplex.bench.replay import ReplayResult, adapter_key, footprints_for, replay
from loraplex.bench.workloads import HOT_BURST_WINDOW, ScenarioParams, generate
from loraplex.residency.cache import CacheConfig
from loraplex.residency.ledger import Tier, TierBudget, check_tier_share
from loraplex.residency.policy import make_policy, policy_names
from loraplex.residency.simulated import StageCosts


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """Unrounded (the report rounds); None when undefined, never 0."""
    return rounded_ratio(numerator, denominator, None)


POLICIES = ("lru", "lru_priority", "cost_aware", "admit_gdsf", "tiered_gdsf", "tiered_gdsf_fetch")
# The policies the headline compares with lru (issue 33's candidates), each where it ran.
NEW_POLICIES = ("admit_gdsf", "tiered_gdsf", "tiered_gdsf_fetch")
# (label, scenario, L0 slots); hot-burst at several capacities.
POINTS = (
    ("hot-burst@9", "hot-burst", 9),
    ("hot-burst@12", "hot-burst", 12),
    ("hot-burst@16", "hot-burst", 16),
    ("zipf-longtail", "zipf-longtail", 16),
    ("drift", "drift", 16),
    ("cold-storm", "cold-storm", 16),
)
DRIFT_PHASES = 5  # workloads.drift's default: the hot set rotates every 20 % of the run
_DRIFT_BUCKETS = DRIFT_PHASES * 20  # 5 % of a rotation period per timeline bucket
_RECOVERY_PP = 0.05
# The row of the lower bounds on reloads beside the policies: Belady's in L0 (belady.py), the
# union relaxation's in L1 and L2 (tier_floor.py), and their sum.
BELADY = "belady_l0_floor"


@dataclass(frozen=True)
class PolicyBenchConfig:
    """What one ``bench residency`` run does."""

    policies: tuple[str, ...] = POLICIES  # names of the policy registry
    repeats: int = 3  # seeds per trace (0 .. repeats-1)
    duration_s: float = 600.0  # simulated seconds per trace
    rate: float = 20.0  # requests per second
    l1_adapters: float = 24.0  # CPU tier budget in mean adapters (256 in zipf: smaller than it)
    l2_adapters: float = 64.0  # disk tier budget in mean adapters
    # Seconds each output token holds the request's slot (16 tokens a request): 0.02 is the
    # cache replay's; the real server on 2 shared cores holds slots several times longer.
    tpot_s: float = 0.02
    traces: tuple[str, ...] = tuple(label for label, _, _ in POINTS)  # labels of POINTS to run
    # Also bound L1 and L2 reloads (an LP per trace, seed and tier: seconds to a minute each).
    tier_floors: bool = True
    # Every tier's default tenant share (``serve``'s default_tenant_tier_share is 0.5); 1.0: none
    tenant_tier_share: float = 1.0
    # The shares hold only against equal or lower priorities (``serve``'s tier_share_by_priority)
    tier_share_by_priority: bool = False

    def __post_init__(self) -> None:
        unknown = [p for p in self.policies if p not in policy_names()]
        if unknown or not self.policies:
            raise ValueError(
                f"policies {list(self.policies)} is invalid; expected names from {policy_names()}"
            )
        known = [label for label, _, _ in POINTS]
        if not self.traces or set(self.traces) - set(known):
            raise ValueError(f"traces {list(self.traces)} is invalid; expected labels from {known}")
        for name in ("repeats", "duration_s", "rate", "l1_adapters", "l2_adapters", "tpot_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")
        check_tier_share(self.tenant_tier_share, "tenant_tier_share")


def run_policy_bench(config: PolicyBenchConfig) -> dict[str, Any]:
    """One JSON-able result: per trace, per policy, median [min, max] over seeds."""
    spec = BaseModelSpec("replay", "LlamaForCausalLM", 512, 1376, 8, 8, 8, 64, 8000, "0" * 64)
    params = ScenarioParams(duration_s=config.duration_s, rate=config.rate)
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {}
    timelines: dict[str, dict[str, list[tuple[float, float | None]]]] = {}
    cdfs: dict[str, dict[str, list[float]]] = {}  # hot-burst@9, seed 0: tenant -> policy -> waits
    floors: dict[str, list[dict[str, float | None]]] = {}  # label -> Belady's L0 bound per seed
    for label, scenario, slots in (p for p in POINTS if p[0] in config.traces):
        rows[label] = {p: [] for p in config.policies}
        for seed in range(config.repeats):
            workload = generate(scenario, seed, params)
            footprints = footprints_for(workload.adapters, spec, 64, 4)
            cache_config = _cache_config(footprints, slots, config)
            arrivals = [(r.t_s, (r.tenant, r.adapter)) for r in workload.requests]
            bound = optimal_reloads(arrivals, slots, cache_config.reload_window_s)
            floor = {"reloads_per_1k_l0": bound.reload_floor_per_1k}
            if config.tier_floors:
                sizes = {
                    (a.tenant, a.name): footprints[adapter_key(a)].memory_bytes
                    for a in workload.adapters
                }
                floor |= tier_floors(arrivals, sizes, cache_config)
                floor["reloads_per_1k"] = sum(floor.values())
            row: dict[str, float | None] = {**floor}
            floors.setdefault(label, []).append(row)
            order = config.policies if seed % 2 == 0 else config.policies[::-1]
            for policy in order:
                result = replay(
                    workload,
                    cache_config,
                    make_policy(policy),
                    footprints,
                    StageCosts(),
                    tpot_s=config.tpot_s,
                    num_buckets=_DRIFT_BUCKETS if scenario == "drift" else 40,
                    waits_from_s=_waits_from_s(scenario, config.duration_s),
                )
                rows[label][policy].append(_row(result, scenario, config.duration_s))
                if seed == 0:
                    timelines.setdefault(label, {})[policy] = result.timeline
                if seed == 0 and label == config.traces[0] and scenario == "hot-burst":
                    for tenant, waits in result.tenant_waits.items():
                        cdfs.setdefault(tenant, {})[policy] = [round(w, 6) for w in waits]
    summary = {label: {p: _pool(runs) for p, runs in pols.items()} for label, pols in rows.items()}
    for label, runs in floors.items():
        summary[label][BELADY] = _pool(runs)
    return {
        "name": "residency",
        "config": vars(config) | {"policies": list(config.policies), "traces": list(config.traces)},
        "seed": list(range(config.repeats)),
        "metrics": headline(summary, config.policies),
        "traces": summary,
        "timelines": timelines,
        "wait_cdfs": cdfs,
    }


def _waits_from_s(scenario: str, duration_s: float) -> float:
    """Hot-burst's waits count from the sweep on, as ``bench serve`` reads the hot tenant's
    TTFT: the cold start of the hot set before it is the same under every policy."""
    return HOT_BURST_WINDOW[0] * duration_s if scenario == "hot-burst" else 0.0


def _cache_config(footprints: dict[Any, Any], slots: int, config: PolicyBenchConfig) -> CacheConfig:
    first = next(iter(footprints.values()))
    mean = sum(f.memory_bytes for f in footprints.values()) / len(footprints)
    share = config.tenant_tier_share
    budgets = {
        Tier.L0: TierBudget(slots * first.slot_bytes, slots, default_tenant_share=share),
        Tier.L1: TierBudget(int(config.l1_adapters * mean), default_tenant_share=share),
        Tier.L2: TierBudget(int(config.l2_adapters * mean), default_tenant_share=share),
    }
    return CacheConfig(
        budgets,
        default_deadline_s=None,
        tenant_priority=REPLAY_PRIORITY,
        tier_share_by_priority=config.tier_share_by_priority,
    )


def _row(result: ReplayResult, scenario: str, duration_s: float) -> dict[str, float | None]:
    n = max(1, result.num_requests)
    served = result.served_from
    row: dict[str, float | None] = {
        "hit_l0": served["L0"] / n,
        "hit_l0_l1": (served["L0"] + served["L1"]) / n,
        "hit_l1_local": ratio(served["L1"], n - served["L0"]),
        "hit_l0_l2": (served["L0"] + served["L1"] + served["L2"]) / n,
        "failed": float(result.failed),
    }
    for tier, count in result.reloads_after_eviction.items():
        row[f"reloads_per_1k_{tier.lower()}"] = 1000 * count / n
    row["reloads_per_1k"] = 1000 * result.total_reloads / n
    for tier, count in result.loads.items():
        # Every fill, reload or not: a policy cannot look better on reloads by refilling later.
        row[f"fills_per_1k_{tier.lower()}"] = 1000 * count / n
    for tenant, waits in result.tenant_wait_s.items():
        for q, value in waits.items():
            row[f"wait_{q}_s_{tenant}"] = value
    if scenario == "drift":
        row["drift_recovery_share"] = drift_recovery_share(result.timeline, duration_s)
    return row


def drift_recovery_share(
    timeline: Sequence[tuple[float, float | None]], duration_s: float
) -> float | None:
    """How long after a rotation of the hot set the L0 hit ratio is back, as a fraction of the
    rotation period. The timeline's buckets are averaged over drift's rotations, aligned at the
    rotation (one bucket holds too few requests to resolve 5 pp); recovery is the end of the
    first aligned bucket within 5 pp of the steady state (the mean of the period's second
    half, so some bucket there always qualifies). None when a bucket has no requests."""
    per_phase = len(timeline) // DRIFT_PHASES
    curves = [timeline[p * per_phase : (p + 1) * per_phase] for p in range(1, DRIFT_PHASES)]
    if any(h is None for curve in curves for _, h in curve):
        return None
    mean = [statistics.fmean(float(c[i][1] or 0.0) for c in curves) for i in range(per_phase)]
    target = statistics.fmean(mean[per_phase // 2 :]) - _RECOVERY_PP
    back = next((i + 1 for i, h in enumerate(mean) if h >= target), per_phase)
    return back / per_phase


def _pool(runs: list[dict[str, float | None]]) -> dict[str, list[float] | None]:
    """metric -> [median, min, max] over the seeds (None where a seed had it undefined)."""
    return {name: median_min_max([r.get(name) for r in runs]) for name in runs[0]}


def _med(summary: dict[str, Any], label: str, policy: str, metric: str) -> float | None:
    cell = summary.get(label, {}).get(policy, {}).get(metric)
    return None if cell is None else float(cell[0])


def headline(summary: dict[str, Any], policies: Sequence[str]) -> dict[str, float | None]:
    """The issue's targets as medians and ratios: each new policy against lru, then the floors."""
    out: dict[str, float | None] = {}
    if "lru" not in policies:
        return {}
    for new in (p for p in NEW_POLICIES if p in policies):
        out |= _policy_headline(summary, policies, new)
    for label, _, _ in POINTS:
        prefix = label.replace("-", "_").replace("@", "_s")
        # The most any policy could cut lru's reloads, per tier and all tiers together (with
        # the tier floors; without them L1 and L2 enter at their trivial floor 0).
        for tier in ("l0", "l1", "l2"):
            out[f"{prefix}_{tier}_reloads_lru_over_floor"] = ratio(
                _med(summary, label, "lru", f"reloads_per_1k_{tier}"),
                _med(summary, label, BELADY, f"reloads_per_1k_{tier}"),
            )
        base = _med(summary, label, "lru", "reloads_per_1k")
        out[f"{prefix}_reloads_lru_over_floor"] = ratio(
            base, _med(summary, label, BELADY, "reloads_per_1k")
        )
        out[f"{prefix}_reloads_lru_over_belady_l0_floor"] = ratio(
            base, _med(summary, label, BELADY, "reloads_per_1k_l0")
        )
    for policy in policies:
        out[f"drift_recovery_share_{policy}"] = _med(
            summary, "drift", policy, "drift_recovery_share"
        )
    return {k: None if v is None else round(v, 4) for k, v in out.items()}


def _policy_headline(
    summary: dict[str, Any], policies: Sequence[str], new: str
) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for slots in (9, 12, 16):
        label = f"hot-burst@{slots}"
        hot = {p: _med(summary, label, p, "wait_p99_s_prio") for p in policies}
        batch = {p: _med(summary, label, p, "wait_p50_s_batch") for p in policies}
        out[f"hot_burst_s{slots}_hot_p99_wait_lru_over_{new}"] = ratio(hot["lru"], hot[new])
        if "lru_priority" in policies:
            out[f"hot_burst_s{slots}_hot_p99_wait_lru_priority_over_{new}"] = ratio(
                hot["lru_priority"], hot[new]
            )
        out[f"hot_burst_s{slots}_batch_p50_wait_{new}_over_lru"] = ratio(batch[new], batch["lru"])
    for label in ("zipf-longtail", "drift", "cold-storm"):
        prefix = label.replace("-", "_")
        for metric in ("hit_l0", "hit_l0_l1", "hit_l1_local"):
            mine, base = _med(summary, label, new, metric), _med(summary, label, "lru", metric)
            out[f"{prefix}_{metric}_{new}_pp_over_lru"] = (
                None if mine is None or base is None else round(100 * (mine - base), 2)
            )
        # Every tenant's median and tail wait against lru's: no tenant may pay for the gain.
        waits = sorted(m for m in summary.get(label, {}).get(new, {}) if m.startswith("wait_p"))
        for metric in waits:
            q, tenant = metric.removeprefix("wait_").split("_s_", 1)
            out[f"{prefix}_{q}_wait_{tenant}_{new}_over_lru"] = ratio(
                _med(summary, label, new, metric), _med(summary, label, "lru", metric)
            )
    for label, _, _ in POINTS:
        prefix = label.replace("-", "_").replace("@", "_s")
        out[f"{prefix}_reloads_lru_over_{new}"] = ratio(
            _med(summary, label, "lru", "reloads_per_1k"),
            _med(summary, label, new, "reloads_per_1k"),
        )
    return out
