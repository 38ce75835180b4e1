"""Cache-only replay: a trace against the real TieredAdapterCache in simulated time.

Torch-free. The cache's own code decides everything (tier order, policy, budgets, single
flight, deadlines); only the executor and the pipeline are simulated (both live in
``loraplex.residency``): ``SimExecutor`` orders phases and timers deterministically by (time,
sequence) on a ManualClock, and ``SimulatedPipeline`` charges each stage the cost measured for
it (``StageCosts``), moving no bytes. Each request holds its lease for
``output_tokens * tpot_s``; its wait (arrival to lease, simulated seconds) is what residency
costs it before its first token, the replay's stand-in for TTFT's adapter part.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from loraplex.artifacts.base_model import BaseModelSpec, lora_bytes
from loraplex.artifacts.identity import AdapterKey
from loraplex.bench.workloads import TraceAdapter, Workload
from loraplex.clock import ManualClock
from loraplex.residency.cache import CacheConfig, Lease, SimExecutor, TieredAdapterCache
from loraplex.residency.ledger import Tier
from loraplex.residency.pipeline import Footprint
from loraplex.residency.policy import EvictionPolicy
from loraplex.residency.simulated import SimulatedPipeline, StageCosts
from loraplex.residency.stats import percentile

# How soon a request held back from a borrowed GPU copy asks again (the engine asks each step).
RECLAIM_RECHECK_S = 0.02
_BASE_DIGEST = hashlib.sha256(b"replay-base").hexdigest()


def adapter_key(adapter: TraceAdapter) -> AdapterKey:
    """A deterministic key for a trace adapter (digests derived from its name)."""
    digest = hashlib.sha256(f"{adapter.tenant}/{adapter.name}".encode()).hexdigest()
    return AdapterKey(_BASE_DIGEST, adapter.tenant, adapter.name, "r1", digest)


def footprints_for(
    adapters: Sequence[TraceAdapter], spec: BaseModelSpec, slot_rank: int, bytes_per_param: int
) -> dict[AdapterKey, Footprint]:
    from loraplex.bench.workloads import ALL_TARGETS

    slot = lora_bytes(spec, slot_rank, bytes_per_param, ALL_TARGETS)
    result = {}
    for a in adapters:
        size = lora_bytes(spec, a.rank, bytes_per_param, a.targets)
        result[adapter_key(a)] = Footprint(slot_bytes=slot, memory_bytes=size, disk_bytes=size)
    return result


@dataclass
class ReplayResult:
    """What one replay measured."""

    policy: str  # eviction policy name
    num_requests: int  # requests replayed
    served_from: dict[str, int]  # requests by the tier their adapter came from (L0..L3)
    failed: int  # requests whose acquire failed (deadline, capacity)
    tenant_windows: dict[str, dict[str, float | None]]  # tenant -> window -> L0 hit ratio
    evictions: dict[str, int]  # per tier
    reloads_after_eviction: dict[str, int]  # per tier
    thrash_ratio: float  # reloads-after-eviction / evictions
    # tenant -> {"p50", "p99"}: seconds from arrival to lease over every request (a failed one
    # at the end of the trace: it never got a lease); None when the tenant sent nothing
    tenant_wait_s: dict[str, dict[str, float | None]] = field(default_factory=dict)
    # (bucket start s, L0 hit ratio; None for a bucket without requests)
    timeline: list[tuple[float, float | None]] = field(default_factory=list)
    # tenant -> every request's wait, ascending (failed ones at the trace's length): the CDF
    tenant_waits: dict[str, list[float]] = field(default_factory=dict)
    loads: dict[str, int] = field(default_factory=dict)  # completed fills per tier (L0..L2)

    @property
    def hit_ratio(self) -> dict[str, float]:
        total = max(1, self.num_requests)
        return {tier: count / total for tier, count in self.served_from.items()}

    @property
    def total_reloads(self) -> int:
        return sum(self.reloads_after_eviction.values())


def replay(
    workload: Workload,
    config: CacheConfig,
    policy: EvictionPolicy,
    footprints: Mapping[AdapterKey, Footprint],
    costs: StageCosts,
    *,
    tpot_s: float = 0.02,
    windows: Mapping[str, tuple[float, float]] | None = None,
    num_buckets: int = 40,
    waits_from_s: float = 0.0,
) -> ReplayResult:
    """Replays ``workload`` against a fresh cache; ``windows`` names fractions of the run.
    The tenants' waits count requests arriving from ``waits_from_s`` on (hot-burst: from the
    sweep on, as ``bench serve`` reads the hot tenant's TTFT)."""
    clock = ManualClock()
    executor = SimExecutor(clock)
    cache = TieredAdapterCache(
        config, SimulatedPipeline(footprints, costs), policy=policy, clock=clock, executor=executor
    )
    keys = {(a.tenant, a.name): adapter_key(a) for a in workload.adapters}
    outcomes: list[Outcome] = []
    for request in workload.requests:
        executor.run_until(request.t_s)
        hold_s = request.output_tokens * tpot_s
        done = _on_lease(executor, outcomes, request.t_s, request.tenant, hold_s)
        _ask(cache, executor, keys[(request.tenant, request.adapter)], done)
    executor.drain()
    cache.check_integrity()
    return _summarise(
        workload,
        policy.name,
        cache=cache,
        outcomes=outcomes,
        windows=windows or {},
        num_buckets=num_buckets,
        waits_from_s=waits_from_s,
    )


def _ask(
    cache: TieredAdapterCache,
    executor: SimExecutor,
    key: AdapterKey,
    done: Callable[[Any], None],
) -> None:
    """Asks for ``key``'s lease as the engine's lease desk does: not while its GPU copy is
    borrowed room another tenant's load waits for (``TieredAdapterCache.reclaiming``; never
    under a share of 1.0), but again a step (``RECLAIM_RECHECK_S``) later."""
    if cache.reclaiming(key):
        later = executor.clock.now() + RECLAIM_RECHECK_S
        executor.call_at(later, lambda: _ask(cache, executor, key, done))
        return
    cache.acquire_future(key).add_done_callback(done)


# One request's outcome: (arrival, tenant, source tier name or "failed", seconds to the lease).
Outcome = tuple[float, str, str, float]


def _on_lease(
    executor: SimExecutor,
    outcomes: list[Outcome],
    t_s: float,
    tenant: str,
    hold_s: float,
) -> Callable[[Any], None]:
    def done(future: Any) -> None:
        wait_s = executor.clock.now() - t_s
        if future.exception() is not None:
            outcomes.append((t_s, tenant, "failed", math.inf))
            return
        lease: Lease = future.result()
        outcomes.append((t_s, tenant, lease.load.source.name, wait_s))
        executor.call_at(executor.clock.now() + hold_s, lease.release)

    return done


def _summarise(
    workload: Workload,
    policy: str,
    *,
    cache: TieredAdapterCache,
    outcomes: list[Outcome],
    windows: Mapping[str, tuple[float, float]],
    num_buckets: int,
    waits_from_s: float,
) -> ReplayResult:
    stats = cache.snapshot().stats
    served = {t.name: 0 for t in Tier}
    for _, _, source, _ in outcomes:
        if source in served:
            served[source] += 1
    duration = workload.duration_s
    per_tenant: dict[str, dict[str, float | None]] = {}
    for tenant in sorted({o[1] for o in outcomes}):
        per_tenant[tenant] = {
            name: _l0_ratio(
                [o for o in outcomes if o[1] == tenant and lo * duration <= o[0] < hi * duration]
            )
            for name, (lo, hi) in windows.items()
        }
    width = duration / num_buckets
    timeline = [
        (i * width, _l0_ratio([o for o in outcomes if i * width <= o[0] < (i + 1) * width]))
        for i in range(num_buckets)
    ]
    waited = [o for o in outcomes if o[0] >= waits_from_s]
    return ReplayResult(
        policy=policy,
        num_requests=len(outcomes),
        served_from=served,
        failed=sum(1 for o in outcomes if o[2] == "failed"),
        tenant_windows=per_tenant,
        evictions={t.name: n for t, n in stats.evictions.items()},
        reloads_after_eviction={t.name: n for t, n in stats.reloads_after_eviction.items()},
        thrash_ratio=stats.thrash_ratio,
        tenant_wait_s={
            tenant: _wait_quantiles([o[3] for o in waited if o[1] == tenant], duration)
            for tenant in per_tenant
        },
        timeline=timeline,
        loads={t.name: n for t, n in stats.loads.items()},
        tenant_waits={
            tenant: sorted(min(o[3], duration) for o in waited if o[1] == tenant)
            for tenant in per_tenant
        },
    )


def _wait_quantiles(waits: Sequence[float], duration_s: float) -> dict[str, float | None]:
    """P50/P99 of the waits; a failed request (inf) counts as the whole trace's length."""
    ordered = sorted(min(w, duration_s) for w in waits)
    if not ordered:
        return {"p50": None, "p99": None}
    return {"p50": percentile(ordered, 0.5), "p99": percentile(ordered, 0.99)}


def _l0_ratio(outcomes: Sequence[Outcome]) -> float | None:
    """Share of ``outcomes`` served from L0; None (undefined) without any."""
    return sum(1 for o in outcomes if o[2] == "L0") / len(outcomes) if outcomes else None
