"""TieredAdapterCache: the one entry point of the adapter cache (L3 -> L2 -> L1 -> L0).

Concurrency model: all bookkeeping (ledgers, jobs, pins, stats) is guarded by one re-entrant
lock (``CacheLock``) and never waits on I/O or on the engine's slot lock: drops of evicted
copies (an L2 ``rmtree``, an L0 slot clear), discards of staged bytes and the submission of
pipeline phases are queued under the lock and run, in order, after it is released. Phases
(resolve, prepare, install) run on the injected ``StepExecutor`` (worker threads for the real
cache, discrete events in the replay) and report back through callbacks that retake the lock.
``acquire_future`` never blocks its caller. A load walks one move at a time towards its target
tier: prepare off-lock, take room in the target (victims are dropped only now, so a failed load
evicts nothing), install off-lock, commit. Where the copies are and every tier decision live in
``TierState``; the load state machine is ``LoadFlow``; placement is ``placement.decide``.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import replace
from functools import partial

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.clock import Clock, MonotonicClock
from loraplex.residency.cache.cache_lock import CacheLock
from loraplex.residency.cache.changes import ResidencyChanges
from loraplex.residency.cache.config import CacheConfig, share_outranks
from loraplex.residency.cache.executors import StepExecutor, ThreadStepExecutor
from loraplex.residency.cache.jobs import JobTable, Lease, LoadJob, Waiter
from loraplex.residency.cache.load_flow import LoadFlow
from loraplex.residency.cache.recovery import adopt_recovered
from loraplex.residency.cache.tier_state import TierState
from loraplex.residency.cache.view import (
    CacheSummary,
    CopyHolds,
    ResidencySnapshot,
    Unpinned,
    build_snapshot,
    build_summary,
)
from loraplex.residency.ledger import Tier, TierLedger
from loraplex.residency.pipeline import LoadPipeline, LoadResult
from loraplex.residency.policy import DEFAULT_POLICY, EvictionPolicy, make_policy

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
        self._clock = clock or MonotonicClock()
        self._executor = executor or ThreadStepExecutor(self._clock, config.max_concurrent_loads)
        self._pipeline = pipeline
        self._lock = CacheLock()
        self._jobs = JobTable(config.max_concurrent_loads, config.tenant_max_concurrent_loads)
        self._state = TierState(
            config, policy or make_policy(DEFAULT_POLICY), self._clock, self._jobs, self._drop
        )
        self._flow = LoadFlow(self._state, self._jobs, self._lock, pipeline, self._executor)

    @property
    def config(self) -> CacheConfig:
        """The configuration in force (tenant limits are live settings)."""
        return self._state.config

    @property
    def ledgers(self) -> Mapping[Tier, TierLedger]:
        """Per-tier accounting (read it only; the cache mutates it under its lock)."""
        return self._state.ledgers

    # --- acquiring ---------------------------------------------------------------------------

    def acquire_future(
        self,
        key: AdapterKey,
        *,
        deadline_s: float | None = None,
        requester: str | None = None,
        traffic: bool = True,
    ) -> Future[Lease]:
        """A future lease on ``key`` in L0; never blocks. Fails with CapacityError when
        ``deadline_s`` (a duration: seconds from now; default from the config) passes without
        a slot. ``requester``: the tenant whose request asks; a load this starts is charged to
        it in every tier (its share, its cap), and the owner's own ask moves the charge of the
        key's copies (and of a load under way) to the owner (``ResidentEntry.charged``).
        None: no tenant's request asks (the merged-mode switch, a replay): a load this starts
        is charged to the owner, and every charge stays where it is. ``auto`` merges the
        revision a caller of another tenant's public adapter made the hottest, so moving the
        charge on that ask handed the caller's copy to the owner (attack26). ``traffic`` False:
        a release's output probe (``EngineRequest.probe``), counted in no request rate, so its
        probes earn a candidate no automatic warm seat and no eviction rank."""
        future: Future[Lease] = Future()
        with self._lock:
            state, now = self._state, self._clock.now()
            if requester == key.tenant:
                state.charge_owner(key)
            by_owner = requester in (None, key.tenant)
            history = state.touch(key, now, by_owner=by_owner, traffic=traffic)
            entry = state.ready_entry(key, Tier.L0)
            if entry is not None:
                state.stats.record_hit(Tier.L0, history)
                future.set_result(state.grant(entry, LoadResult(key, Tier.L0, {}), self._release))
                return future
            source = state.source_tier(key, Tier.L0)
            state.record_reads(key, source, now)
            if source is Tier.L3:
                state.stats.misses += 1
            else:
                state.stats.record_hit(source, history)
            wait_s = self.config.default_deadline_s if deadline_s is None else deadline_s
            self._flow.attach(
                key,
                Tier.L0,
                Waiter(future, wants_lease=True, source=source, asked_at_s=now),
                optional=False,
                deadline_at_s=None if wait_s is None else now + wait_s,
                charged=requester,
            )
        return future

    def prefetch(
        self, key: AdapterKey, tier: Tier, *, requester: str | None = None
    ) -> Future[None]:
        """Brings ``key`` into ``tier`` if the policy judges it worth its victims; the future
        fails with CapacityError when it is not. ``requester``: the tenant whose queued
        request it is for (the engine's prefetch window), charged as by ``acquire_future``
        (the owner's moves the charge of the key's copies to the owner); None (warm policies,
        an operator's prefetch): a load it starts is the owner's and no charge moves."""
        with self._lock:
            if requester == key.tenant:
                self._state.charge_owner(key)
            return self._flow.load_into(key, tier, optional=True, charged=requester)

    # --- operator controls ---------------------------------------------------------------------

    def pin(self, key: AdapterKey, tier: Tier) -> Future[None]:
        """Keeps ``key`` in ``tier``, loading it first; pinned copies are never evicted."""
        with self._lock:
            self._state.pins.pin(key, tier)
            self._state.refresh_pins(key)
            return self._flow.load_into(key, tier, optional=False)

    def unpin(self, key: AdapterKey, tier: Tier) -> Unpinned:
        """Lifts the pin of ``key`` in ``tier``; the answer says whether there was one and
        which warm policy keeps the copy pinned still (an unpin never changes a policy)."""
        with self._lock:
            pins = self._state.pins
            lifted = pins.has_pin(key, tier)
            pins.unpin(key, tier)
            self._state.refresh_pins(key)
            self._flow.retry_blocked()
            self._state.settle_key(key)
            warm = pins.warm_hold(key, tier)
            return Unpinned(lifted, frozenset(() if warm is None else (warm,)))

    def explicit_pins(self) -> set[tuple[AdapterKey, Tier]]:
        """The (revision, tier) pairs ``pin`` holds (what an ingress sent; no warm policy's)."""
        with self._lock:
            return self._state.pins.explicit_pins()

    def set_warm_policy(self, key: AdapterKey, warm: WarmPolicy | None) -> None:
        """The operator's warm policy for one revision (None: automatic). Operator settings win."""
        with self._lock:
            self._state.pins.set_operator(key, warm)
            self._apply_warm(key)

    def drop_auto_warm(self, key: AdapterKey) -> None:
        """The traffic that earned ``key`` its automatic warm policy no longer reaches it (its
        revision was deprecated: no alias serves it): that policy goes, its pins with it, and
        its request rates start afresh, so only the requests from now on (its owner's
        ``@REVISION`` pins) can earn it one again. An operator's warm policy and pins stay."""
        with self._lock:
            self._state.drop_auto_warm(key)
            self._apply_warm(key)

    def rebalance(self) -> dict[AdapterKey, WarmPolicy]:
        """Automatic promotion/demotion from the rolling request statistics; returns changes."""
        with self._lock:
            changes = self._state.rebalance_warm()
            for key in changes:
                self._apply_warm(key)
            return changes

    def set_tenant_limits(
        self, priority: Mapping[str, float], caps: Mapping[Tier, Mapping[str, int]]
    ) -> None:
        """Live tenant settings: keep-priority weights and per-tier byte caps. A lowered cap
        evicts the tenant's idle copies down to it; copies in use or pinned leave when released
        and unpinned, and nothing new is admitted above the cap meanwhile."""
        with self._lock:
            state = self._state
            for tier, ledger in state.ledgers.items():
                ledger.set_tenant_caps(caps.get(tier, {}))
            budgets = {tier: ledger.budget for tier, ledger in state.ledgers.items()}
            state.reconfigure(
                replace(state.config, budgets=budgets, tenant_priority=dict(priority))
            )
            for tier, ledger in state.ledgers.items():
                # ranking every copy only for tenants above their own cap (a share is no cap)
                for tenant in [t for t in ledger.tenant_bytes if not ledger.within_cap(t)]:
                    for entry in state.ranked_victims(tier):
                        if ledger.within_cap(tenant):
                            break
                        if entry.charged == tenant:
                            state.evict(entry)

    def evict(self, key: AdapterKey, tier: Tier) -> bool:
        """Drops ``key`` from ``tier`` unless it is pinned, in use or loading; True if dropped."""
        with self._lock:
            entry = self._state.ledgers[tier].get(key)
            if entry is None or not entry.evictable:
                return False
            self._state.evict(entry)
            self._flow.retry_blocked()
            return True

    def holds(self, key: AdapterKey, tier: Tier) -> CopyHolds:
        """What keeps ``key``'s copy in ``tier`` from eviction (``evict`` says only whether it
        went): its pin, the warm policy pinning it, its leases and loads, its install."""
        with self._lock:
            pins = self._state.pins
            entry = self._state.ledgers[tier].get(key)
            warm = pins.warm_hold(key, tier)
            return CopyHolds(
                resident=entry is not None,
                pinned=pins.has_pin(key, tier),
                warm=frozenset(() if warm is None else (warm,)),
                in_use=0 if entry is None else entry.refcount,
                loading=entry is not None and not entry.ready,
            )

    def cancel(self, key: AdapterKey) -> bool:
        """Cancels the load of ``key`` for every waiter (LoadCancelledError); True if one ran."""
        with self._lock:
            return self._flow.cancel(key)

    def recover(self) -> list[AdapterKey]:
        """Adopts the verified L2 copies that survived a restart, oldest first, evicting by the
        policy where they exceed the L2 budget; returns the keys dropped. Call once at start,
        before the first acquire (verification reads every file, off the lock)."""
        copies = self._pipeline.recover()
        with self._lock:
            return adopt_recovered(self._state, copies)

    # --- views ---------------------------------------------------------------------------------

    def snapshot(self, top: int | None = None) -> ResidencySnapshot:
        """Every copy, or with ``top`` at most ``top`` copies, most hits first."""
        with self._lock:
            return build_snapshot(self._state, len(self._jobs), self._jobs.num_blocked, top)

    def summary(self) -> CacheSummary:
        """Counters only: the cost does not grow with the number of cached copies."""
        with self._lock:
            return build_summary(self._state, len(self._jobs), self._jobs.num_blocked)

    def num_evictions(self) -> int:
        """Evictions so far, every cached tier summed (``summary().stats.evictions``), without
        a summary's stage percentiles (each sorts up to its retained samples)."""
        with self._lock:
            return sum(self._state.stats.evictions.values())

    def residency_changes(self, since: int) -> ResidencyChanges:
        """Keys whose ready tiers changed after version ``since`` (O(changes)), or the whole
        map with ``full=True`` when ``since`` <= 0 or older than the bounded change log."""
        with self._lock:
            state = self._state
            return state.changes.since(since, state.ready_tiers, state.all_ready_tiers)

    def check_integrity(self) -> None:
        """Raises CacheIntegrityError naming the first broken invariant."""
        with self._lock:
            self._state.check()
            self._jobs.check(self._state.ledgers)

    def is_resident(self, key: AdapterKey, tier: Tier) -> bool:
        with self._lock:
            return self._state.ready_entry(key, tier) is not None

    def is_moving(self, key: AdapterKey) -> bool:
        """Whether a load of ``key`` is under way now: started (past the concurrency bounds'
        queue) and not blocked waiting for room. A queued or blocked load may take any time."""
        with self._lock:
            job = self._jobs.get(key)
            return job is not None and job.started and not self._jobs.is_blocked(job)

    def reclaiming(self, key: AdapterKey) -> bool:
        """Whether a new lease on ``key``'s GPU copy should wait: the tenant charged for it
        (``ResidentEntry.charged``) holds more of L0 than its share (borrowed room) while a
        load of another tenant under its share waits for L0 room. The engine then asks for no
        lease on it this step, so the copy's leases drain and the waiting load reclaims it
        (``residency/reclaim.py``). NOTE: a hit always
        got a lease at once, so a tenant that started its next request on each borrowed copy
        before the last one ended kept every copy in use, never evictable, and another
        tenant's load waited for room until its deadline (attack12)."""
        with self._lock:
            entry = self._state.ready_entry(key, Tier.L0)
            if entry is None or entry.pinned:  # a pin is never reclaimed
                return False
            ledger, tenant = self._state.ledgers[Tier.L0], entry.charged
            share = ledger.tenant_share(tenant)
            if share is None or ledger.tenant_bytes.get(tenant, 0) <= share:
                return False
            config = self._state.config
            return any(
                _reclaims_l0(job, ledger, tenant)
                and not share_outranks(config, tenant, job.charged)
                for job in self._jobs.blocked()
            )

    def residency(self, tier: Tier) -> list[AdapterKey]:
        """The keys with a ready copy in ``tier`` (cheaper than a snapshot)."""
        with self._lock:
            return [key for key, entry in self._state.ledgers[tier].entries.items() if entry.ready]

    def pinned_keys(self) -> set[AdapterKey]:
        """The keys with a pinned copy in some cached tier: a snapshot's pinned entries' keys,
        at O(revisions with a pin or a warm policy), not O(copies)."""
        with self._lock:
            state = self._state
            ledgers = state.ledgers.values()
            return {
                key
                for key in state.pins.pinnable_keys()
                if any((e := lg.get(key)) is not None and e.pinned for lg in ledgers)
            }

    def close(self) -> None:
        """Stops the worker threads of the default executor (waits for running phases)."""
        if isinstance(self._executor, ThreadStepExecutor):
            self._executor.shutdown()

    # --- internals -----------------------------------------------------------------------------

    def _release(self, key: AdapterKey) -> None:
        self._flow.release(key)

    def _drop(self, tier: Tier, key: AdapterKey, slot: int | None) -> None:
        """Queues the removal of a copy's bytes until the lock is released."""
        self._lock.later(partial(self._pipeline.drop, tier, key, slot))

    def _apply_warm(self, key: AdapterKey) -> None:
        self._state.refresh_pins(key)
        for tier in sorted(self._state.pins.pinned_tiers(key)):
            self._flow.load_into(key, tier, optional=False)
        self._flow.retry_blocked()
        self._state.settle_key(key)  # a demoted revision without copies may now be forgotten


def _reclaims_l0(job: LoadJob, ledger: TierLedger, besides: str) -> bool:
    """Whether ``job`` waits for L0 room for a tenant other than ``besides``, under its share
    (so the room it may take includes other tenants' borrowed copies), room that unpinned
    copies leaving would give it (a load that waits for an unpin gains nothing). Tenants are
    the ones charged (``ResidentEntry.charged``, ``LoadJob.charged``)."""
    tenant = job.charged
    if tenant == besides or job.move is None or job.move.target is not Tier.L0:
        return False
    share = ledger.tenant_share(tenant)
    if share is None or ledger.tenant_bytes.get(tenant, 0) >= share or job.footprint is None:
        return False
    return ledger.fits_beside_pins(tenant, job.footprint.bytes_in(Tier.L0))
