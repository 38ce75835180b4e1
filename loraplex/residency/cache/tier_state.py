"""The cache's copies across tiers and every decision about them: the tier order, victims,
the policy's judgements, pins, per-key history and telemetry.

Torch-free; every method runs under the cache's lock. ``LoadFlow`` drives loads through this
object's methods only (it never touches a ledger or a counter directly). Removing a copy hands
its bytes to ``on_drop``, which queues the pipeline's drop to run after the lock is released.

Per-key maps are bounded: a key's history and footprint stay while it has a copy, a load or a
pin, and for the ``config.max_idle_keys`` most recently active keys without any (eviction must
remember frequency across residency); older idle keys are forgotten, oldest first.

Victims come from one ``VictimIndex`` per tier (the policy's exact order, maintained
incrementally): every change to a copy's order inputs made here notes its key there.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.clock import Clock
from loraplex.errors import CacheIntegrityError
from loraplex.residency.cache.changes import ChangeLog
from loraplex.residency.cache.config import CacheConfig, ReloadCosts
from loraplex.residency.cache.jobs import JobTable, Lease
from loraplex.residency.cache.victim_index import VictimIndex
from loraplex.residency.cache.victim_order import PolicyOrder
from loraplex.residency.ledger import CACHED_TIERS, TIER_BELOW, ResidentEntry, Tier, TierLedger
from loraplex.residency.ledger import require_invariant as require
from loraplex.residency.pipeline import LoadResult, Move, Resolved
from loraplex.residency.policy import Candidate, EvictionPolicy
from loraplex.residency.stats import AdapterHistory, CacheStats
from loraplex.residency.warm import PinBook


class TierState:
    """Ledgers of L0-L2, per-key history and footprints, pins, stats and the change log."""

    def __init__(
        self,
        config: CacheConfig,
        policy: EvictionPolicy,
        clock: Clock,
        jobs: JobTable,
        on_drop: Callable[[Tier, AdapterKey, int | None], None],
    ) -> None:
        self.config = config
        self.policy = policy
        self.clock = clock
        self.stats = CacheStats(config.reload_window_s)
        self.pins = PinBook(
            config.auto_warm,
            config.max_auto_gpu_slots,
            config.budgets[Tier.L0].default_tenant_share,  # the seats' share, as the slots'
        )
        self.ledgers = {t: TierLedger(t, config.budgets[t]) for t in CACHED_TIERS}
        self.costs = ReloadCosts(config)
        self.changes = ChangeLog()
        self._jobs = jobs
        self._on_drop = on_drop
        self._history: dict[AdapterKey, AdapterHistory] = {}
        self._footprints: dict[AdapterKey, Resolved] = {}  # resolve once per key
        self._idle: OrderedDict[AdapterKey, None] = OrderedDict()  # no copy/load/pin, oldest first
        self._orders = {t: PolicyOrder(self, t) for t in CACHED_TIERS}
        self._victims = {
            t: VictimIndex(self.ledgers[t].entries, order, config.victim_order_horizon_s)
            for t, order in self._orders.items()
        }

    def reconfigure(self, config: CacheConfig) -> None:
        """New settings (tenant priorities, caps): every copy's order key may have changed."""
        self.config = config
        for index in self._victims.values():
            index.horizon_s = config.victim_order_horizon_s
            index.invalidate()

    # --- per-key maps ----------------------------------------------------------------------

    def history_of(self, key: AdapterKey) -> AdapterHistory:
        """The key's history (created on first use); the key counts as active again."""
        self._idle.pop(key, None)
        history = self._history.get(key)
        if history is None:
            history = self._history[key] = AdapterHistory()
        return history

    def histories(self) -> Iterator[tuple[AdapterKey, AdapterHistory]]:
        return iter(self._history.items())

    def touch(
        self, key: AdapterKey, now_s: float, *, by_owner: bool = True, traffic: bool = True
    ) -> AdapterHistory:
        """A request for ``key``; ``by_owner`` False: another tenant's (a caller of a public
        adapter), which counts in the order's rates but earns the owner no automatic warm seat
        (``AdapterHistory.owner_rates``); ``traffic`` False: a release's output probe, no
        tenant's demand: it counts in no rate (its access time still moves)."""
        history = self.history_of(key)
        history.last_access_s = now_s
        if traffic:
            history.rates.record(now_s)
        if traffic and by_owner:
            history.owner_rates.record(now_s)
            self.pins.requested(key)
        self._note(key)
        return history

    def record_reads(self, key: AdapterKey, source: Tier, now_s: float) -> None:
        """A request that missed L0 reads L1, and L2 too when L1 had no copy (``source``: the
        nearest tier holding one); call after ``touch`` (which re-indexes the key)."""
        history = self.history_of(key)
        for tier in (Tier.L1, Tier.L2):
            if tier <= source:
                history.reads[tier].record(now_s)

    def restore_access(self, key: AdapterKey, at_s: float) -> AdapterHistory:
        """Sets ``key``'s last access (a copy recovered at start was last used at ``at_s``)."""
        history = self.history_of(key)
        history.last_access_s = at_s
        self._note(key)
        return history

    def drop_auto_warm(self, key: AdapterKey) -> None:
        """``key``'s request rates start afresh and its automatic warm policy goes
        (``TieredAdapterCache.drop_auto_warm``)."""
        history = self._history.get(key)
        if history is not None:
            fresh = AdapterHistory()
            history.rates, history.reads = fresh.rates, fresh.reads
            history.owner_rates = fresh.owner_rates
            self._note(key)  # the rates are order inputs
        self.pins.drop_auto(key)

    def rebalance_warm(self) -> dict[AdapterKey, WarmPolicy]:
        """Automatic promotion/demotion of the keys a rebalance may change (``PinBook.due``):
        the same changes as judging every key with a history, at O(due) cost. The GPU tier's
        per-tenant caps and the footprints known go with it: no seat for a copy a cap refuses."""
        now = self._now()
        rates = {
            key: history.owner_rates.rates(now)
            for key in self.pins.due()
            if (history := self._history.get(key)) is not None
        }
        caps = self.ledgers[Tier.L0].budget.tenant_max_bytes
        return self.pins.rebalance(rates, caps, self._gpu_bytes)

    def _gpu_bytes(self, key: AdapterKey) -> int | None:
        """``key``'s GPU copy size; None until its footprint is known (resolved once)."""
        resolved = self._footprints.get(key)
        return None if resolved is None else resolved.footprint.bytes_in(Tier.L0)

    def footprint_of(self, key: AdapterKey) -> Resolved | None:
        return self._footprints.get(key)

    def remember_footprint(self, key: AdapterKey, resolved: Resolved) -> None:
        self._footprints[key] = resolved
        self._note(key)  # reload costs follow the footprint

    def settle_key(self, key: AdapterKey) -> None:
        """Call when ``key`` may have lost its last copy or load: it joins the idle keys, and
        the oldest idle keys beyond the bound are forgotten."""
        if not self._is_idle(key):
            return
        self._idle[key] = None
        self._idle.move_to_end(key)
        while len(self._idle) > self.config.max_idle_keys:
            oldest, _ = self._idle.popitem(last=False)
            if self._is_idle(oldest):
                self._history.pop(oldest, None)
                self._footprints.pop(oldest, None)
                self.pins.forget(oldest)

    def _is_idle(self, key: AdapterKey) -> bool:
        return (
            all(key not in ledger.entries for ledger in self.ledgers.values())
            and self._jobs.get(key) is None
            and not self.pins.pinned_tiers(key)
        )

    # --- the tier order ----------------------------------------------------------------------

    def ready_entry(self, key: AdapterKey, tier: Tier) -> ResidentEntry | None:
        entry = self.ledgers[tier].get(key)
        return entry if entry is not None and entry.ready else None

    def ready_tiers(self, key: AdapterKey) -> tuple[Tier, ...]:
        """The cached tiers holding a ready copy of ``key``, fastest first."""
        return tuple(t for t in CACHED_TIERS if self.ready_entry(key, t) is not None)

    def all_ready_tiers(self) -> Iterator[tuple[AdapterKey, tuple[Tier, ...]]]:
        """Every key with a ready copy and its ready tiers, fastest first (O(copies))."""
        seen: set[AdapterKey] = set()
        for ledger in self.ledgers.values():
            for key, entry in ledger.entries.items():
                if entry.ready and key not in seen:
                    seen.add(key)
                    yield key, self.ready_tiers(key)

    def source_tier(self, key: AdapterKey, target: Tier) -> Tier:
        """The nearest tier below ``target`` holding a ready copy (L3 always has one)."""
        for tier in CACHED_TIERS:
            if tier > target and self.ready_entry(key, tier) is not None:
                return tier
        return Tier.L3

    def next_move(self, key: AdapterKey, target: Tier) -> Move | None:
        """The next fill on the way to ``target``; None once a ready copy is there."""
        if self.ready_entry(key, target) is not None:
            return None
        source = self.source_tier(key, target)
        return Move(key, source, Tier(source - 1))

    # --- copies --------------------------------------------------------------------------------

    def reserve(
        self, tier: Tier, key: AdapterKey, size_bytes: int, charged: str | None = None
    ) -> ResidentEntry:
        entry = self.ledgers[tier].reserve(key, size_bytes, self.clock.now(), charged)
        self._victims[tier].note(key, self._now())
        return entry

    def charge_owner(self, key: AdapterKey) -> None:
        """The owner asked for ``key`` (it would have loaded it anyway): each copy charged to
        another tenant, and a load of it under way, move to the owner's charge (a copy the
        owner's own cap cannot take stays where it is). O(tiers)."""
        owner = key.tenant
        for tier, ledger in self.ledgers.items():
            entry = ledger.get(key)
            if entry is not None and entry.charged != owner and ledger.recharge(key, owner):
                self._victims[tier].note(key, self._now())  # its priority is the owner's now
        job = self._jobs.get(key)
        if job is not None:
            job.charged = owner

    def mark_ready(self, entry: ResidentEntry) -> None:
        """An installed copy becomes usable (and protected if a pin covers its tier)."""
        entry.ready = True
        entry.pinned = self.pins.is_pinned(entry.key, entry.tier)
        self.changes.note(entry.key)

    def remove(self, entry: ResidentEntry, *, drop: bool = True) -> None:
        """Removes a copy (ready or not) and queues the drop of its bytes (``drop`` False: the
        caller hands them on, see ``evict``)."""
        self.ledgers[entry.tier].remove(entry.key)
        self._victims[entry.tier].note(entry.key, self._now())
        if drop:
            self._on_drop(entry.tier, entry.key, entry.slot)
        if entry.ready:
            self.changes.note(entry.key)

    def drop_bytes(self, tier: Tier, key: AdapterKey) -> None:
        """Queues the removal of bytes no ledger entry accounts for (a rejected recovery)."""
        self._on_drop(tier, key, None)

    def evict(self, entry: ResidentEntry, *, drop: bool = True) -> None:
        """Evicts a copy; ``drop`` False leaves its bytes where they are, for the caller to
        ``drop_evicted`` or to hand its slot to an install, which replaces them."""
        self.remove(entry, drop=drop)
        self.stats.record_eviction(entry.tier, self.history_of(entry.key), self.clock.now())
        self.settle_key(entry.key)

    def drop_evicted(self, entry: ResidentEntry) -> None:
        """Queues the drop of the bytes of a copy evicted with ``drop`` False."""
        self._on_drop(entry.tier, entry.key, entry.slot)

    def drop_corrupt(self, key: AdapterKey, tier: Tier) -> None:
        """A copy that failed verification on its way up is never read again: the next load
        of ``key`` refetches from below (a pinned or leased copy stays until released)."""
        entry = None if tier is Tier.L3 else self.ledgers[tier].get(key)
        if entry is not None and entry.refcount == 0 and not entry.pinned:
            self.evict(entry)

    def grant(
        self, entry: ResidentEntry, load: LoadResult, on_release: Callable[[AdapterKey], None]
    ) -> Lease:
        if entry.slot is None:
            raise CacheIntegrityError("every L0 entry owns a slot", entry.key.ref)
        entry.refcount += 1
        entry.last_access_s = self.clock.now()
        return Lease(entry.key, entry.slot, load, on_release)

    def refresh_pins(self, key: AdapterKey) -> None:
        for ledger in self.ledgers.values():
            entry = ledger.get(key)
            if entry is not None and entry.ready:
                entry.pinned = self.pins.is_pinned(key, ledger.tier)

    # --- the policy's view ---------------------------------------------------------------------

    def ranked_victims(self, tier: Tier) -> Iterator[ResidentEntry]:
        """Evictable entries of ``tier``, most evictable first by the policy, lazily (the
        iterator is valid until the next call; entries may be evicted while it runs)."""
        order, bandwidth = self._orders[tier], self.costs.bandwidth(TIER_BELOW[tier])
        if not order.holds(bandwidth):
            order.reset(bandwidth)
            self._victims[tier].invalidate()
        return self._victims[tier].ranked(self._now())

    def candidate(self, entry: ResidentEntry) -> Candidate:
        return self.candidate_of(
            entry.key, entry.tier, entry.size_bytes, entry.loaded_at_s, charged=entry.charged
        )

    def candidate_of(
        self,
        key: AdapterKey,
        tier: Tier,
        size_bytes: int,
        loaded_at_s: float,
        *,
        at_s: float | None = None,
        bandwidth: float | None = None,
        charged: str | None = None,
    ) -> Candidate:
        """What the policy knows of one copy, with rates as of ``at_s`` (default now) and the
        reload cost at ``bandwidth`` (default the current estimate). Its priority is the
        tenant's it is charged to (``charged``, None: the owner's; ``ResidentEntry.charged``).
        NOTE: with the owner's priority, a low-priority caller's copy of a high-priority
        tenant's public adapter outlived the high-priority tenant's own copies."""
        history = self.history_of(key)
        resolved = self._footprints.get(key)
        at = self._now() if at_s is None else at_s
        reads = history.reads.get(tier)
        return Candidate(
            key=key,
            size_bytes=size_bytes,
            loaded_at_s=loaded_at_s,
            last_access_s=history.last_access_s,
            rates=history.rates.rates(at),
            priority=self.config.tenant_priority.get(charged or key.tenant, 1.0),
            reload_cost_s=self.costs.reload_cost_s(
                tier, None if resolved is None else resolved.footprint, size_bytes, bandwidth
            ),
            reads=None if reads is None else reads.rates(at),
            tier=tier,
        )

    def refill_bytes(self, key: AdapterKey, tier: Tier, size_bytes: int) -> int:
        """The bytes a refill of ``key``'s copy in ``tier`` reads (``ReloadCosts``)."""
        resolved = self._footprints.get(key)
        footprint = None if resolved is None else resolved.footprint
        return self.costs.refill_bytes(tier, footprint, size_bytes)

    def check(self) -> None:
        """Ledger invariants, plus: every ready copy's pinned flag equals the pin book, and the
        victim indexes cover every copy with floors that bound their keys."""
        for tier, ledger in self.ledgers.items():
            ledger.check()
            if self._orders[tier].holds(self.costs.bandwidth(TIER_BELOW[tier])):
                self._victims[tier].check(self._now())  # else the next query rebuilds it
            for entry in ledger.entries.values():
                require(
                    not entry.ready or entry.pinned == self.pins.is_pinned(entry.key, entry.tier),
                    "pin flags match pins",
                    f"{entry.key.ref} in {entry.tier.name}",
                )

    def _now(self) -> float:
        return self.clock.now()

    def _note(self, key: AdapterKey) -> None:
        """``key``'s order inputs changed: its copies' floors are recomputed when next needed."""
        now = self._now()
        for tier, index in self._victims.items():
            if key in self.ledgers[tier].entries:
                index.note(key, now)
