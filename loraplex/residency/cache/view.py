"""Read-only views of the adapter cache: residency snapshots and the job-side integrity checks.

Torch-free; called by ``cache.py`` under its lock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from loraplex.artifacts.identity import AdapterKey
from loraplex.errors import CacheIntegrityError
from loraplex.residency.cache.load_flow import LoadFlow
from loraplex.residency.ledger import ResidentEntry, Tier, TierLedger
from loraplex.residency.stats import AdapterHistory, CacheStats, CacheStatsSnapshot
from loraplex.residency.warm import PinBook


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


@dataclass(frozen=True)
class ResidencySnapshot:
    """The whole cache at one instant."""

    entries: tuple[EntrySnapshot, ...]  # every copy in every cached tier
    stats: CacheStatsSnapshot  # telemetry
    num_loading: int  # loads in flight or queued
    num_blocked: int  # loads waiting for room

    def tier_of(self, key: AdapterKey) -> Tier | None:
        """The fastest tier holding a ready copy of ``key``."""
        tiers = [e.tier for e in self.entries if e.key == key and e.ready]
        return min(tiers) if tiers else None


def entry_snapshot(entry: ResidentEntry, history: AdapterHistory) -> EntrySnapshot:
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
    )


def build_snapshot(
    ledgers: Mapping[Tier, TierLedger],
    history: Mapping[AdapterKey, AdapterHistory],
    stats: CacheStats,
    flow: LoadFlow,
) -> ResidencySnapshot:
    entries = tuple(
        entry_snapshot(e, history[e.key])
        for ledger in ledgers.values()
        for e in sorted(ledger.entries.values(), key=lambda e: e.key)
    )
    counts = {t: len(lg.entries) for t, lg in ledgers.items()}
    used = {t: lg.used_bytes for t, lg in ledgers.items()}
    return ResidencySnapshot(
        entries,
        stats.snapshot(counts, used),
        num_loading=len(flow.jobs),
        num_blocked=len(flow.blocked),
    )


def check_pin_flags(ledgers: Mapping[Tier, TierLedger], pins: PinBook) -> None:
    """Every ready copy's pinned flag equals what the pin book says."""
    for ledger in ledgers.values():
        for entry in ledger.entries.values():
            _require(
                not entry.ready or entry.pinned == pins.is_pinned(entry.key, entry.tier),
                "pin flags match pins",
                f"{entry.key.ref} in {entry.tier.name}",
            )


def check_jobs(flow: LoadFlow, ledgers: Mapping[Tier, TierLedger], bounds: tuple[int, int]) -> None:
    """Job-side invariants: bounded concurrency, reserved entries owned by their job, and
    refcounts of lower-tier copies equal to the loads reading them."""
    jobs, running = flow.jobs, flow.running
    tenant_max, total_max = bounds
    started = [j for j in jobs.values() if j.started]
    _require(
        sum(running.values()) == len(started),
        "running loads counted",
        f"{dict(running)} vs {len(started)} started",
    )
    _require(len(started) <= total_max, "global load bound", f"{len(started)} > {total_max}")
    for tenant, count in running.items():
        _require(0 < count <= tenant_max, "per-tenant load bound", f"{tenant!r}: {count}")
    for job in [*flow.queue, *flow.blocked]:
        _require(jobs.get(job.key) is job, "queued and blocked loads are live", job.key.ref)
    readers: dict[tuple[AdapterKey, Tier], int] = {}
    for job in jobs.values():
        if job.source_entry is not None:
            ident = (job.key, job.source_entry.tier)
            readers[ident] = readers.get(ident, 0) + 1
        if job.reserved is not None:
            owner = ledgers[job.reserved.tier].get(job.key)
            _require(owner is job.reserved, "reserved room owned by its load", job.key.ref)
    for tier, ledger in ledgers.items():
        for entry in ledger.entries.values():
            if not entry.ready:
                loader = jobs.get(entry.key)
                _require(
                    loader is not None and loader.reserved is entry,
                    "unready entries are loading",
                    f"{entry.key.ref} in {tier.name}",
                )
            elif tier is not Tier.L0:
                expected = readers.get((entry.key, tier), 0)
                _require(
                    entry.refcount == expected,
                    "lower-tier refcounts equal readers",
                    f"{entry.key.ref} in {tier.name}: {entry.refcount} != {expected}",
                )


def _require(ok: bool, invariant: str, detail: str) -> None:
    if not ok:
        raise CacheIntegrityError(invariant, detail)
