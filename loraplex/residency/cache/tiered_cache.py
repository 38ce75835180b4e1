"""TieredAdapterCache: the one place the tier order lives (L3 -> L2 -> L1 -> L0).

Concurrency model: all bookkeeping (ledgers, jobs, pins, stats) is guarded by one re-entrant
lock and never waits on I/O; pipeline phases (resolve, prepare, install) run on the injected
``StepExecutor`` (worker threads for the real cache, an event queue in the replay) and report
back through callbacks that retake the lock. ``acquire_future`` never blocks its caller and
``async acquire`` awaits it, so an event loop keeps running. A load walks one move at a time
towards its target tier: prepare off-lock, take room in the target (victims are dropped only
now, so a failed load evicts nothing), install off-lock, commit. The state machine itself
(queue, phases, undo) is ``cache_flow.LoadFlow``; this class owns the tier decisions.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import replace

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.clock import Clock, MonotonicClock
from loraplex.errors import CacheIntegrityError, CapacityError
from loraplex.residency.cache.config import CacheConfig, ReloadCosts
from loraplex.residency.cache.jobs import Lease, StepExecutor, ThreadStepExecutor, Waiter
from loraplex.residency.cache.load_flow import LoadFlow
from loraplex.residency.cache.view import (
    ResidencySnapshot,
    build_snapshot,
    check_jobs,
    check_pin_flags,
)
from loraplex.residency.ledger import CACHED_TIERS, ResidentEntry, Tier, TierLedger
from loraplex.residency.pipeline import Footprint, LoadPipeline, LoadResult, Move
from loraplex.residency.policy import Candidate, EvictionPolicy, make_policy
from loraplex.residency.stats import AdapterHistory, CacheStats
from loraplex.residency.warm import PinBook

__all__ = ["CacheConfig", "TieredAdapterCache"]


class TieredAdapterCache:
    """Adapters in four tiers with leases, single-flight bounded loads, pins and eviction."""

    def __init__(
        self,
        config: CacheConfig,
        pipeline: LoadPipeline,
        *,
        policy: EvictionPolicy | None = None,
        clock: Clock | None = None,
        executor: StepExecutor | None = None,
    ) -> None:
        self.config = config
        self.policy = policy or make_policy("cost_aware")
        self.clock = clock or MonotonicClock()
        self.stats = CacheStats(config.reload_window_s)
        self.pins = PinBook(config.auto_warm, config.max_auto_gpu_slots)
        self.ledgers = {t: TierLedger(t, config.budgets[t]) for t in CACHED_TIERS}
        self.history: dict[AdapterKey, AdapterHistory] = {}
        self.lock = threading.RLock()
        executor = executor or ThreadStepExecutor(self.clock, config.max_concurrent_loads)
        self._executor = executor
        self._flow = LoadFlow(self, pipeline, executor)
        self.costs = ReloadCosts(config)

    # --- acquiring ---------------------------------------------------------------------------

    def acquire_future(self, key: AdapterKey, *, deadline_s: float | None = None) -> Future[Lease]:
        """A future lease on ``key`` in L0; never blocks. Fails with CapacityError when
        ``deadline_s`` (seconds from now; default from the config) passes without a slot."""
        future: Future[Lease] = Future()
        with self.lock:
            now = self.clock.now()
            history = self.touch(key, now)
            entry = self.ledgers[Tier.L0].get(key)
            if entry is not None and entry.ready:
                self.stats.record_hit(Tier.L0, history)
                future.set_result(self.grant(entry, LoadResult(key, Tier.L0, {})))
                return future
            source = self.source_tier(key, Tier.L0)
            if source is Tier.L3:
                self.stats.misses += 1
            else:
                self.stats.record_hit(source, history)
            waiter = Waiter(future, wants_lease=True, source=source)
            wait_s = self.config.default_deadline_s if deadline_s is None else deadline_s
            self._flow.attach(
                key,
                Tier.L0,
                waiter,
                optional=False,
                deadline_s=None if wait_s is None else now + wait_s,
            )
        return future

    async def acquire(self, key: AdapterKey, *, deadline_s: float | None = None) -> Lease:
        """Awaits a lease without blocking the event loop; cancelling the await abandons it."""
        future = self.acquire_future(key, deadline_s=deadline_s)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                future.result().release()
            raise

    def try_acquire(self, key: AdapterKey) -> Lease | None:
        """A lease when ``key`` is in L0 now; otherwise None, and a lease-less load into L0 is
        started (a lease granted to a future nobody holds would pin the slot forever)."""
        with self.lock:
            entry = self.ledgers[Tier.L0].get(key)
            if entry is None or not entry.ready:
                self._flow.load_into(key, Tier.L0, optional=False)
                return None
            self.stats.record_hit(Tier.L0, self.touch(key, self.clock.now()))
            return self.grant(entry, LoadResult(key, Tier.L0, {}))

    def prefetch(self, key: AdapterKey, tier: Tier) -> Future[None]:
        """Brings ``key`` into ``tier`` if the policy judges it worth its victims; the future
        fails with CapacityError when it is not."""
        with self.lock:
            return self._flow.load_into(key, tier, optional=True)

    # --- operator controls ---------------------------------------------------------------------

    def pin(self, key: AdapterKey, tier: Tier) -> Future[None]:
        """Keeps ``key`` in ``tier``, loading it first; pinned copies are never evicted."""
        with self.lock:
            self.pins.pin(key, tier)
            self.refresh_pins(key)
            return self._flow.load_into(key, tier, optional=False)

    def unpin(self, key: AdapterKey, tier: Tier) -> None:
        with self.lock:
            self.pins.unpin(key, tier)
            self.refresh_pins(key)
            self._flow.retry_blocked()

    def set_warm_policy(self, key: AdapterKey, warm: WarmPolicy | None) -> None:
        """The operator's warm policy for one revision (None: automatic). Operator settings win."""
        with self.lock:
            self.pins.set_operator(key, warm)
            self._apply_warm(key)

    def rebalance(self) -> dict[AdapterKey, WarmPolicy]:
        """Automatic promotion/demotion from the rolling request statistics; returns changes."""
        with self.lock:
            now = self.clock.now()
            changes = self.pins.rebalance({k: h.rates.rates(now) for k, h in self.history.items()})
            for key in changes:
                self._apply_warm(key)
            return changes

    def set_tenant_limits(
        self, priority: Mapping[str, float], caps: Mapping[Tier, Mapping[str, int]]
    ) -> None:
        """Live tenant settings: keep-priority weights and per-tier byte caps. A lowered cap
        evicts the tenant's idle copies down to it; copies in use or pinned leave when released
        and unpinned, and nothing new is admitted above the cap meanwhile."""
        with self.lock:
            for tier, ledger in self.ledgers.items():
                ledger.set_tenant_caps(caps.get(tier, {}))
            budgets = {tier: ledger.budget for tier, ledger in self.ledgers.items()}
            self.config = replace(self.config, budgets=budgets, tenant_priority=dict(priority))
            for tier, ledger in self.ledgers.items():
                for tenant, cap in ledger.budget.tenant_max_bytes.items():
                    for entry in self.ranked_victims(tier):
                        if ledger.tenant_bytes.get(tenant, 0) <= cap:
                            break
                        if entry.key.tenant == tenant:
                            self.evict(entry.key, tier)

    def evict(self, key: AdapterKey, tier: Tier) -> bool:
        """Drops ``key`` from ``tier`` unless it is pinned, in use or loading; True if dropped."""
        with self.lock:
            entry = self.ledgers[tier].get(key)
            if entry is None or not entry.evictable:
                return False
            self._flow.evict_entry(entry)
            self._flow.retry_blocked()
            return True

    def cancel(self, key: AdapterKey) -> bool:
        """Cancels the load of ``key`` for every waiter (LoadCancelledError); True if one ran."""
        with self.lock:
            return self._flow.cancel(key)

    def recover(self) -> list[AdapterKey]:
        """Adopts the verified L2 copies that survived a restart, oldest first, evicting by the
        policy where they exceed the L2 budget; returns the keys dropped. Call once at start,
        before the first acquire (verification reads every file, off the lock)."""
        copies = self._flow.pipeline.recover()
        dropped: list[AdapterKey] = []
        with self.lock:
            ledger, now = self.ledgers[Tier.L2], self.clock.now()
            for copy in sorted(copies, key=lambda c: (-c.age_s, c.key)):
                history = self.history.setdefault(copy.key, AdapterHistory())
                history.last_access_s = now - copy.age_s
                victims = None
                if copy.key not in ledger.entries:
                    with contextlib.suppress(CapacityError):
                        ledger.check_admissible(copy.key.tenant, copy.size_bytes)
                        victims = ledger.plan_room(
                            copy.key.tenant, copy.size_bytes, self.ranked_victims(Tier.L2)
                        )
                if victims is None:
                    self._flow.pipeline.drop(Tier.L2, copy.key, None)
                    dropped.append(copy.key)
                    continue
                for victim in victims:
                    self._flow.evict_entry(victim)
                    dropped.append(victim.key)
                entry = ledger.reserve(copy.key, copy.size_bytes, now)
                entry.ready, entry.last_access_s = True, history.last_access_s
        return dropped

    # --- views ---------------------------------------------------------------------------------

    def snapshot(self) -> ResidencySnapshot:
        with self.lock:
            return build_snapshot(self.ledgers, self.history, self.stats, self._flow)

    def check_integrity(self) -> None:
        """Raises CacheIntegrityError naming the first broken invariant."""
        with self.lock:
            for ledger in self.ledgers.values():
                ledger.check()
            check_pin_flags(self.ledgers, self.pins)
            bounds = (self.config.tenant_max_concurrent_loads, self.config.max_concurrent_loads)
            check_jobs(self._flow, self.ledgers, bounds)

    def is_resident(self, key: AdapterKey, tier: Tier) -> bool:
        with self.lock:
            entry = self.ledgers[tier].get(key)
            return entry is not None and entry.ready

    def residency(self, tier: Tier) -> list[AdapterKey]:
        """The keys with a ready copy in ``tier`` (cheaper than a snapshot)."""
        with self.lock:
            return [key for key, entry in self.ledgers[tier].entries.items() if entry.ready]

    def close(self) -> None:
        """Stops the worker threads of the default executor (waits for running phases)."""
        if isinstance(self._executor, ThreadStepExecutor):
            self._executor.shutdown()

    # --- the tier order and the decisions LoadFlow asks for (all under the lock) -----------------

    def source_tier(self, key: AdapterKey, target: Tier) -> Tier:
        """The nearest tier below ``target`` holding a ready copy (L3 always has one)."""
        for tier in CACHED_TIERS:
            if tier > target:
                entry = self.ledgers[tier].get(key)
                if entry is not None and entry.ready:
                    return tier
        return Tier.L3

    def next_move(self, key: AdapterKey, target: Tier) -> Move | None:
        """The next fill on the way to ``target``; None once a ready copy is there."""
        entry = self.ledgers[target].get(key)
        if entry is not None and entry.ready:
            return None
        source = self.source_tier(key, target)
        return Move(key, source, Tier(source - 1))

    def ranked_victims(self, tier: Tier) -> list[ResidentEntry]:
        """Evictable entries of ``tier``, most evictable first by the policy."""
        ledger = self.ledgers[tier]
        now = self.clock.now()
        candidates = [
            self.candidate(e.key, e.tier, e.size_bytes, e.loaded_at_s)
            for e in ledger.entries.values()
            if e.evictable
        ]
        return [ledger.entries[c.key] for c in self.policy.order_victims(candidates, now)]

    def candidate(
        self, key: AdapterKey, tier: Tier, size_bytes: int, loaded_at_s: float
    ) -> Candidate:
        history = self.history[key]
        now = self.clock.now()
        resolved = self._flow.footprints.get(key)
        footprint = None if resolved is None else resolved.footprint
        return Candidate(
            key=key,
            size_bytes=size_bytes,
            loaded_at_s=loaded_at_s,
            last_access_s=history.last_access_s,
            rates=history.rates.rates(now),
            priority=self.config.tenant_priority.get(key.tenant, 1.0),
            reload_cost_s=self.costs.reload_cost_s(tier, footprint, size_bytes),
        )

    def admits(self, move: Move, footprint: Footprint, victims: list[ResidentEntry]) -> bool:
        """Whether an optional load may displace ``victims`` (the policy's hysteresis)."""
        now = self.clock.now()
        incoming = self.candidate(move.key, move.target, footprint.bytes_in(move.target), now)
        outgoing = [self.candidate(v.key, v.tier, v.size_bytes, v.loaded_at_s) for v in victims]
        return self.policy.admits(incoming, outgoing, now)

    def deferral_s(
        self, move: Move, footprint: Footprint, victims: list[ResidentEntry], waited_s: float
    ) -> float:
        """How much longer a demand load waits for another copy to become evictable instead of
        displacing ``victims`` now (the policy's bounded deferral; 0: displace now). The copies
        it may wait for are the tier's unpinned entries that are not victims: in use, still
        loading, or too young to go (an idle old one that is cheaper would be a victim)."""
        ledger = self.ledgers[move.target]
        chosen = {v.key for v in victims}
        others = [
            e for e in ledger.entries.values()
            if e.key not in chosen and not e.pinned and e.key in self.history
        ]  # fmt: skip
        held = [self.candidate(e.key, e.tier, e.size_bytes, e.loaded_at_s) for e in others]
        if not held:
            return 0.0
        now = self.clock.now()
        incoming = self.candidate(move.key, move.target, footprint.bytes_in(move.target), now)
        outgoing = [self.candidate(v.key, v.tier, v.size_bytes, v.loaded_at_s) for v in victims]
        return self.policy.deferral_s(incoming, outgoing, held, waited_s, now)

    def touch(self, key: AdapterKey, now_s: float) -> AdapterHistory:
        history = self.history.setdefault(key, AdapterHistory())
        history.rates.record(now_s)
        history.last_access_s = now_s
        return history

    def grant(self, entry: ResidentEntry, load: LoadResult) -> Lease:
        entry.refcount += 1
        entry.last_access_s = self.clock.now()
        if entry.slot is None:
            raise CacheIntegrityError("every L0 entry owns a slot", entry.key.ref)
        return Lease(self, entry.key, entry.slot, load)

    def release(self, key: AdapterKey) -> None:
        with self.lock:
            entry = self.ledgers[Tier.L0].get(key)
            if entry is None or entry.refcount <= 0:
                raise CacheIntegrityError("leases match refcounts", f"release of {key.ref}")
            entry.refcount -= 1
            self._flow.retry_blocked()

    def refresh_pins(self, key: AdapterKey) -> None:
        for ledger in self.ledgers.values():
            entry = ledger.get(key)
            if entry is not None and entry.ready:
                entry.pinned = self.pins.is_pinned(key, ledger.tier)

    def _apply_warm(self, key: AdapterKey) -> None:
        self.refresh_pins(key)
        for tier in sorted(self.pins.pinned_tiers(key)):
            self._flow.load_into(key, tier, optional=False)
        self._flow.retry_blocked()
