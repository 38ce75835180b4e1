"""Read-only views of the adapter cache: residency snapshots and the cheap summary.

Torch-free; built under the cache's lock from ``TierState``. ``CacheSummary`` reads counters
only (cost independent of the number of copies); a snapshot lists copies, capped by ``top``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from loraplex.artifacts.identity import AdapterKey
from loraplex.residency.cache.tier_state import TierState
from loraplex.residency.ledger import ResidentEntry, Tier, TierLedger
from loraplex.residency.stats import AdapterHistory, CacheStatsSnapshot
from loraplex.residency.warm import WarmHold


@dataclass(frozen=True)
class Unpinned:
    """What an unpin did and what keeps the copy pinned after it (``TieredAdapterCache.unpin``;
    a fleet's unpin merges every replica's, ``server/pin_owners.py`` adds the pin's owners)."""

    lifted: bool  # a pin of the (revision, tier) was there and is gone
    warm: frozenset[WarmHold] = frozenset()  # warm policies that pin it still (one per server)
    # owners of the pin holding it still ("release"; ``OwnedPins`` then names no ``warm``)
    owners: frozenset[str] = frozenset()

    @property
    def held(self) -> bool:
        """Whether the copy stays pinned."""
        return bool(self.warm or self.owners)


@dataclass(frozen=True)
class CopyHolds:
    """What keeps one copy from eviction (``TieredAdapterCache.holds``; a fleet's merges every
    replica's, ``server/pin_owners.py`` adds the pin's owners): ``evict`` says only whether
    the copy went."""

    resident: bool  # a copy is in the tier
    pinned: bool  # a pin (``pin``) holds it
    warm: frozenset[WarmHold] = frozenset()  # warm policies that pin it
    in_use: int = 0  # leases and loads using the copy
    loading: bool = False  # the copy is still being installed
    owners: frozenset[str] = frozenset()  # owners of the pin ("operator", "release")


@dataclass(frozen=True)
class EntrySnapshot:
    """One adapter's copy in one tier."""

    key: AdapterKey  # the adapter revision
    tier: Tier  # where the copy is
    size_bytes: int  # bytes charged for it
    ready: bool  # False while being installed
    pinned: bool  # never evicted
    refcount: int  # leases and loads using it
    slot: int | None  # L0 slot
    hits: int  # acquires served from this tier
    loads: int  # fills of this tier
    evictions: int  # evictions from this tier
    last_access_s: float  # last acquire of the adapter
    # the fleet engine replica holding the copy (``/admin/residency`` of a fleet lists every
    # replica's copies: without it a revision on two replicas was two rows saying nothing of
    # where); None on one server
    replica: str | None = None
    # the tenant whose share and cap the copy counts against (``ResidentEntry.charged``): the
    # one whose request loaded it, the owner unless another tenant called a public adapter;
    # admin only (no tenant sees another's copies). None: not known (built by hand)
    charged_to: str | None = None


@dataclass(frozen=True)
class ResidencySnapshot:
    """The cache's copies at one instant (all of them, or the ``top`` hottest)."""

    entries: tuple[EntrySnapshot, ...]  # copies by tier then key, or hottest first with top
    stats: CacheStatsSnapshot  # telemetry
    num_loading: int  # loads in flight or queued
    num_blocked: int  # loads waiting for room

    def tier_of(self, key: AdapterKey) -> Tier | None:
        """The fastest tier holding a ready copy of ``key`` (among the listed entries)."""
        tiers = [e.tier for e in self.entries if e.key == key and e.ready]
        return min(tiers) if tiers else None


@dataclass(frozen=True)
class CacheSummary:
    """Counters of the whole cache (no per-copy work)."""

    stats: CacheStatsSnapshot  # telemetry
    num_loading: int  # loads in flight or queued
    num_blocked: int  # loads waiting for room
    used_bytes: Mapping[Tier, int]  # bytes held or reserved per cached tier
    capacity_bytes: Mapping[Tier, int]  # budget per cached tier
    num_copies: Mapping[Tier, int]  # entries (ready or loading) per cached tier
    # per cached tier, the bytes each tenant keeps against the others (its default share; free
    # room beyond it is borrowed, reclaimed first); a tier without a default share is absent
    default_tenant_bytes: Mapping[Tier, int] = field(default_factory=dict)


def stats_snapshot(state: TierState) -> CacheStatsSnapshot:
    counts = {t: len(lg.entries) for t, lg in state.ledgers.items()}
    used = {t: lg.used_bytes for t, lg in state.ledgers.items()}
    return state.stats.snapshot(counts, used)


def build_summary(state: TierState, num_loading: int, num_blocked: int) -> CacheSummary:
    ledgers = state.ledgers
    return CacheSummary(
        stats=stats_snapshot(state),
        num_loading=num_loading,
        num_blocked=num_blocked,
        used_bytes={t: lg.used_bytes for t, lg in ledgers.items()},
        capacity_bytes={t: lg.budget.capacity_bytes for t, lg in ledgers.items()},
        num_copies={t: len(lg.entries) for t, lg in ledgers.items()},
        default_tenant_bytes=_default_tenant_bytes(ledgers),
    )


def _default_tenant_bytes(ledgers: Mapping[Tier, TierLedger]) -> dict[Tier, int]:
    caps = {t: lg.budget.default_tenant_share_bytes for t, lg in ledgers.items()}
    return {t: cap for t, cap in caps.items() if cap is not None}


def build_snapshot(
    state: TierState, num_loading: int, num_blocked: int, top: int | None
) -> ResidencySnapshot:
    """Every copy by tier then key; with ``top``, at most ``top`` copies, most hits first
    (a partial selection, not a sort of every copy)."""
    if top is not None and top < 0:
        raise ValueError(f"top {top} is invalid; expected >= 0")
    if top is None:
        entries = tuple(
            _entry(e, state.history_of(e.key))
            for ledger in state.ledgers.values()
            for e in sorted(ledger.entries.values(), key=lambda e: e.key)
        )
    else:
        hottest = heapq.nlargest(top, _all_entries(state), key=lambda e: _hits(state, e))
        entries = tuple(_entry(e, state.history_of(e.key)) for e in hottest)
    return ResidencySnapshot(entries, stats_snapshot(state), num_loading, num_blocked)


def _all_entries(state: TierState) -> Iterator[ResidentEntry]:
    for ledger in state.ledgers.values():
        yield from ledger.entries.values()


def _hits(state: TierState, entry: ResidentEntry) -> int:
    return state.history_of(entry.key).hits.get(entry.tier, 0)


def _entry(entry: ResidentEntry, history: AdapterHistory) -> EntrySnapshot:
    return EntrySnapshot(
        key=entry.key,
        tier=entry.tier,
        size_bytes=entry.size_bytes,
        ready=entry.ready,
        pinned=entry.pinned,
        refcount=entry.refcount,
        slot=entry.slot,
        hits=history.hits.get(entry.tier, 0),
        loads=history.loads.get(entry.tier, 0),
        evictions=history.evictions.get(entry.tier, 0),
        last_access_s=history.last_access_s,
        charged_to=entry.charged,
    )
