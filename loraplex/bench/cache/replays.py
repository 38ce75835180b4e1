"""The trace replays of ``loraplex bench cache``: the real cache in simulated time, tier costs
measured in the same run, every policy on identical capacities.

Hot-burst runs at several slot counts (the 8 hot adapters + 1, + 4, x 2), under lru,
lru_priority, cost_aware and admit_gdsf (issue 33; ``bench residency`` has the full study),
with the tenants' priorities set as the serve benchmark's registry sets them (prio HIGH, batch
BATCH): lru_priority sees the same priority information cost_aware does, so cost_aware's gain
over it is the keep-score's own. Beside the gain, the price: the batch tenant's median wait for
its lease (simulated seconds), cost_aware over lru.
"""

from __future__ import annotations

from typing import Any

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.identity import AdapterKey
from loraplex.bench.harness.stats import ratio
from loraplex.bench.replay import ReplayResult, footprints_for, replay
from loraplex.bench.workloads import ScenarioParams, generate
from loraplex.residency.cache import CacheConfig
from loraplex.residency.ledger import Tier, TierBudget
from loraplex.residency.policy import make_policy
from loraplex.residency.simulated import StageCosts

REPLAYS = {"hot-burst": 9, "zipf-longtail": 16, "drift": 16}  # scenario -> L0 slots (headline)
HOT_BURST_SLOTS = (9, 12, 16)  # the sweep; the first is the headline point
HOT_BURST_POLICIES = ("lru", "lru_priority", "cost_aware", "admit_gdsf")
# Tenant priorities of every replay (the keep-weights of PriorityClass HIGH and BATCH).
REPLAY_PRIORITY = {"prio": 4.0, "batch": 0.25}
_WINDOWS = {"before": (0.0, 0.3), "during": (0.3, 0.5), "after": (0.5, 1.0)}


def run_replays(
    duration_s: float, rate: float, seed: int, costs: StageCosts
) -> dict[str, dict[str, ReplayResult]]:
    """scenario name -> policy -> result; sweep points beyond the first are ``hot-burst@N``."""
    spec = BaseModelSpec("replay", "LlamaForCausalLM", 512, 1376, 8, 8, 8, 64, 8000, "0" * 64)
    params = ScenarioParams(duration_s=duration_s, rate=rate)
    points = [(name, name, slots) for name, slots in REPLAYS.items()]
    points += [("hot-burst", f"hot-burst@{n}", n) for n in HOT_BURST_SLOTS[1:]]
    out: dict[str, dict[str, ReplayResult]] = {}
    for scenario, label, slots in points:
        workload = generate(scenario, seed, params)
        footprints = footprints_for(workload.adapters, spec, 64, 4)
        cache_config = _replay_config(footprints, slots)
        policies = (
            HOT_BURST_POLICIES if scenario == "hot-burst" else ("lru", "cost_aware", "admit_gdsf")
        )
        out[label] = {
            policy: replay(
                workload, cache_config, make_policy(policy), footprints, costs, windows=_WINDOWS
            )
            for policy in policies
        }
    return out


def _replay_config(footprints: dict[AdapterKey, Any], slots: int) -> CacheConfig:
    first = next(iter(footprints.values()))
    mean = sum(f.memory_bytes for f in footprints.values()) / len(footprints)
    budgets = {
        Tier.L0: TierBudget(slots * first.slot_bytes, slots),
        Tier.L1: TierBudget(int(24 * mean)),
        Tier.L2: TierBudget(int(64 * mean)),
    }
    return CacheConfig(budgets, default_deadline_s=None, tenant_priority=REPLAY_PRIORITY)


def _burst_point(burst: dict[str, ReplayResult], prefix: str) -> dict[str, float | None]:
    """The gain (hot tenant's L0 hit ratio during the sweep) per policy and the price (batch
    tenant's P50 wait, cost_aware over each baseline)."""
    out: dict[str, float | None] = {}
    for policy, result in burst.items():
        suffix = "" if policy == "cost_aware" else f"_{policy}"
        out[f"{prefix}_hot_l0_hit_ratio{suffix}"] = result.tenant_windows["prio"]["during"]
    wait = {p: r.tenant_wait_s.get("batch", {}).get("p50") for p, r in burst.items()}
    for base in ("lru", "lru_priority"):
        out[f"{prefix}_batch_p50_wait_cost_aware_over_{base}"] = ratio(
            wait["cost_aware"], wait[base], None
        )
    for policy, value in wait.items():
        out[f"{prefix}_batch_p50_wait_s_{policy}"] = value
    return out


def replay_metrics(replays: dict[str, dict[str, ReplayResult]]) -> dict[str, float | None]:
    """The replays' headline: hot-burst at its first slot count (plus every sweep point under
    ``hot_burst_sN_``), and the L0 hit ratios of zipf-longtail and drift."""
    burst = replays["hot-burst"]
    lru_reloads, ca_reloads = burst["lru"].total_reloads, burst["cost_aware"].total_reloads
    metrics: dict[str, float | None] = {
        **_burst_point(burst, "hot_burst"),
        "hot_burst_hot_l0_hit_ratio_after": burst["cost_aware"].tenant_windows["prio"]["after"],
        "hot_burst_reload_reduction_vs_lru": ratio(lru_reloads, ca_reloads, None),
        "hot_burst_reloads_lru": float(lru_reloads),
        "hot_burst_reloads_cost_aware": float(ca_reloads),
    }
    for slots in HOT_BURST_SLOTS:
        label = "hot-burst" if slots == REPLAYS["hot-burst"] else f"hot-burst@{slots}"
        metrics.update(_burst_point(replays[label], f"hot_burst_s{slots}"))
    for name in ("zipf-longtail", "drift"):
        prefix = name.replace("-", "_")
        for policy, result in replays[name].items():
            suffix = "" if policy == "cost_aware" else f"_{policy}"
            metrics[f"{prefix}_l0_hit_ratio{suffix}"] = result.hit_ratio["L0"]
    return metrics


def replay_row(result: ReplayResult) -> dict[str, Any]:
    return {
        "hit_ratio": {k: round(v, 4) for k, v in result.hit_ratio.items()},
        "evictions": result.evictions,
        "reloads_after_eviction": result.reloads_after_eviction,
        "thrash_ratio": round(result.thrash_ratio, 4),
        "failed": result.failed,
        "tenant_l0_hit_ratio": result.tenant_windows,
        "tenant_wait_s": result.tenant_wait_s,
        "timeline": [(round(t, 1), None if h is None else round(h, 4)) for t, h in result.timeline],
    }
