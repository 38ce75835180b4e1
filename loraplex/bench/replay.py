"""Cache-only replay: a trace against the real TieredAdapterCache in simulated time.

Torch-free. The cache's own code decides everything (tier order, policy, budgets, single
flight, deadlines); only the executor and the pipeline are simulated: ``SimExecutor`` orders
phases and timers deterministically by (time, sequence) on a ManualClock, and
``SimulatedPipeline`` charges each stage the cost measured for it (``StageCosts``), moving no
bytes. Each request holds its lease for ``output_tokens * tpot_s``.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.identity import AdapterKey
from loraplex.bench.workloads import TraceAdapter, Workload
from loraplex.clock import ManualClock
from loraplex.residency.cache.jobs import Lease
from loraplex.residency.cache.tiered_cache import CacheConfig, TieredAdapterCache
from loraplex.residency.ledger import Tier
from loraplex.residency.pipeline import (
    CancelToken,
    Footprint,
    Move,
    Prepared,
    RecoveredCopy,
    Resolved,
)
from loraplex.residency.policy import EvictionPolicy
from loraplex.residency.stats import Stage

T = TypeVar("T")
_BASE_DIGEST = hashlib.sha256(b"replay-base").hexdigest()


class _Timer:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class SimExecutor:
    """Discrete-event executor: a phase's result is computed at once and delivered after the
    simulated duration it reports; ties break by submission order (deterministic)."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self._events: list[tuple[float, int, Callable[[], None], _Timer]] = []
        self._seq = 0

    def run(self, work: Callable[[], T], done: Callable[[T | BaseException], None]) -> None:
        try:
            result: T | BaseException = work()
        except Exception as error:
            result = error
        delay = _duration(result)
        self._push(self.clock.now() + delay, lambda: done(result), _Timer())

    def call_at(self, when_s: float, fn: Callable[[], None]) -> _Timer:
        timer = _Timer()
        self._push(when_s, fn, timer)
        return timer

    def run_until(self, t_s: float) -> None:
        """Delivers every event due at or before ``t_s``, then sets the clock to ``t_s``."""
        while self._events and self._events[0][0] <= t_s:
            when, _, fn, timer = heapq.heappop(self._events)
            self.clock.advance(max(0.0, when - self.clock.now()))
            if not timer.cancelled:
                fn()
        self.clock.advance(max(0.0, t_s - self.clock.now()))

    def step(self) -> bool:
        """Delivers the next event alone; False when none is left."""
        if not self._events:
            return False
        self.run_until(self._events[0][0])
        return True

    def drain(self) -> None:
        while self._events:
            self.run_until(self._events[0][0])

    def _push(self, when_s: float, fn: Callable[[], None], timer: _Timer) -> None:
        self._seq += 1
        heapq.heappush(self._events, (max(when_s, self.clock.now()), self._seq, fn, timer))


def _duration(result: object) -> float:
    if isinstance(result, Resolved | Prepared):
        return sum(result.seconds.values())
    if isinstance(result, dict):
        return float(sum(result.values()))
    return 0.0


@dataclass(frozen=True)
class StageCosts:
    """Per-stage costs: fixed seconds plus bytes over a bandwidth (from measurements)."""

    resolve_s: float = 0.0005  # key -> location
    fetch_bytes_per_s: float = 1e8  # L3 -> quarantine
    verify_bytes_per_s: float = 1e9  # digest + tensor validation
    commit_s: float = 0.0002  # rename into L2
    read_bytes_per_s: float = 5e8  # L2 -> L1 parse
    copy_bytes_per_s: float = 5e9  # L1 -> L0
    per_move_s: float = 0.0005  # fixed overhead of every move


class SimulatedPipeline:
    """A LoadPipeline that moves no bytes and reports each stage's modelled duration."""

    def __init__(self, footprints: Mapping[AdapterKey, Footprint], costs: StageCosts) -> None:
        self.footprints = footprints
        self.costs = costs

    def resolve(self, key: AdapterKey, cancel: CancelToken) -> Resolved:
        cancel.check(Stage.RESOLVE)
        return Resolved(self.footprints[key], {Stage.RESOLVE: self.costs.resolve_s})

    def prepare(self, move: Move, cancel: CancelToken) -> Prepared:
        c, fp = self.costs, self.footprints[move.key]
        if move.target is Tier.L2:
            cancel.check(Stage.FETCH)
            fetch = c.per_move_s + fp.disk_bytes / c.fetch_bytes_per_s
            return Prepared(
                None, {Stage.FETCH: fetch, Stage.VERIFY: fp.disk_bytes / c.verify_bytes_per_s}
            )
        if move.target is Tier.L1:
            cancel.check(Stage.READ)
            return Prepared(None, {Stage.READ: c.per_move_s + fp.disk_bytes / c.read_bytes_per_s})
        return Prepared(None, {})

    def install(
        self, move: Move, prepared: Prepared, slot: int | None, cancel: CancelToken
    ) -> dict[Stage, float]:
        c, fp = self.costs, self.footprints[move.key]
        if move.target is Tier.L2:
            return {Stage.COMMIT: c.commit_s}
        if move.target is Tier.L0:
            cancel.check(Stage.COPY)
            return {Stage.COPY: c.per_move_s + fp.memory_bytes / c.copy_bytes_per_s}
        return {}

    def discard(self, move: Move, prepared: Prepared) -> None:
        return None

    def drop(self, tier: Tier, key: AdapterKey, slot: int | None) -> None:
        return None

    def recover(self) -> list[RecoveredCopy]:
        return []


def adapter_key(adapter: TraceAdapter) -> AdapterKey:
    """A deterministic key for a trace adapter (digests derived from its name)."""
    digest = hashlib.sha256(f"{adapter.tenant}/{adapter.name}".encode()).hexdigest()
    return AdapterKey(_BASE_DIGEST, adapter.tenant, adapter.name, "r1", digest)


def adapter_bytes(
    spec: BaseModelSpec, rank: int, targets: Sequence[str], bytes_per_param: int
) -> int:
    """sum over layers and targets of (d_in + d_out) * rank * bytes_per_param."""
    per_layer = sum(sum(spec.module_shape(m)) for m in targets)
    return spec.num_layers * per_layer * rank * bytes_per_param


def footprints_for(
    adapters: Sequence[TraceAdapter], spec: BaseModelSpec, slot_rank: int, bytes_per_param: int
) -> dict[AdapterKey, Footprint]:
    from loraplex.bench.workloads import ALL_TARGETS

    slot = adapter_bytes(spec, slot_rank, ALL_TARGETS, bytes_per_param)
    result = {}
    for a in adapters:
        size = adapter_bytes(spec, a.rank, a.targets, bytes_per_param)
        result[adapter_key(a)] = Footprint(slot_bytes=slot, memory_bytes=size, disk_bytes=size)
    return result


@dataclass
class ReplayResult:
    """What one replay measured."""

    policy: str  # eviction policy name
    num_requests: int  # requests replayed
    served_from: dict[str, int]  # requests by the tier their adapter came from (L0..L3)
    failed: int  # requests whose acquire failed (deadline, capacity)
    tenant_windows: dict[str, dict[str, float]]  # tenant -> window name -> L0 hit ratio
    evictions: dict[str, int]  # per tier
    reloads_after_eviction: dict[str, int]  # per tier
    thrash_ratio: float  # reloads-after-eviction / evictions
    timeline: list[tuple[float, float]] = field(
        default_factory=list
    )  # (bucket start s, L0 hit ratio)

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
) -> ReplayResult:
    """Replays ``workload`` against a fresh cache; ``windows`` names fractions of the run."""
    clock = ManualClock()
    executor = SimExecutor(clock)
    cache = TieredAdapterCache(
        config, SimulatedPipeline(footprints, costs), policy=policy, clock=clock, executor=executor
    )
    keys = {(a.tenant, a.name): adapter_key(a) for a in workload.adapters}
    outcomes: list[tuple[float, str, str]] = []  # (arrival, tenant, source tier name)
    for request in workload.requests:
        executor.run_until(request.t_s)
        future = cache.acquire_future(keys[(request.tenant, request.adapter)])
        hold_s = request.output_tokens * tpot_s
        future.add_done_callback(_on_lease(executor, outcomes, request.t_s, request.tenant, hold_s))
    executor.drain()
    cache.check_integrity()
    return _summarise(
        workload,
        policy.name,
        cache=cache,
        outcomes=outcomes,
        windows=windows or {},
        num_buckets=num_buckets,
    )


def _on_lease(
    executor: SimExecutor,
    outcomes: list[tuple[float, str, str]],
    t_s: float,
    tenant: str,
    hold_s: float,
) -> Callable[[Any], None]:
    def done(future: Any) -> None:
        if future.exception() is not None:
            outcomes.append((t_s, tenant, "failed"))
            return
        lease: Lease = future.result()
        outcomes.append((t_s, tenant, lease.load.source.name))
        executor.call_at(executor.clock.now() + hold_s, lease.release)

    return done


def _summarise(
    workload: Workload,
    policy: str,
    *,
    cache: TieredAdapterCache,
    outcomes: list[tuple[float, str, str]],
    windows: Mapping[str, tuple[float, float]],
    num_buckets: int,
) -> ReplayResult:
    stats = cache.snapshot().stats
    served = {t.name: 0 for t in Tier}
    for _, _, source in outcomes:
        if source in served:
            served[source] += 1
    duration = workload.duration_s
    per_tenant: dict[str, dict[str, float]] = {}
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
    return ReplayResult(
        policy=policy,
        num_requests=len(outcomes),
        served_from=served,
        failed=sum(1 for o in outcomes if o[2] == "failed"),
        tenant_windows=per_tenant,
        evictions={t.name: n for t, n in stats.evictions.items()},
        reloads_after_eviction={t.name: n for t, n in stats.reloads_after_eviction.items()},
        thrash_ratio=stats.thrash_ratio,
        timeline=timeline,
    )


def _l0_ratio(outcomes: Sequence[tuple[float, str, str]]) -> float:
    return sum(1 for o in outcomes if o[2] == "L0") / len(outcomes) if outcomes else 0.0
