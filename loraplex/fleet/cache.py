"""``FleetCache``: the admin API's ``CacheControl`` over every engine replica's cache.

An operator's (or a release's) pin, unpin, prefetch, eviction and warm policy apply to every
healthy replica, and a pin's future completes only once every one of them holds the copy (the
release controller's prewarm thus waits for the whole fleet before it probes and moves the
alias). Standing pins, warm policies and tenant settings are kept the same on every replica by
``standing.FleetStanding``: a replica that joins later (a replacement after a crash, a
scale-up) gets them, and one that was out of rotation when a pin went out or was lifted is
brought in line when it is back. A standing pin is one per (revision, tier), as in a replica's
cache: pinning twice and unpinning once lifts it.

Reads answer from the board: ``summary`` sums the healthy replicas' summaries, ``is_resident``
is true when any healthy replica holds the copy, ``snapshot`` lists every healthy replica's
copies (one entry per copy: a revision on two replicas is listed twice).

A replica the board still shows healthy but the request router no longer offers (it died: the
board marks it stale only ``stale_after_s`` later) cannot answer; another replica takes its
call and refuses it with ``ReplicaLeftError``. That replica is left out of the call's answer,
as one already off the board is, and the standing state brings it in line if it comes back;
the call fails only when every replica it went to had left.
NOTE: before, that refusal failed the whole call: a tenant's settings, a pin or an eviction
made within 3 s of a replica's death answered 503 to the operator although the registry and
every live replica had it (docs/benchmarks/attackfleet3.md).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.engine.tenant_shares import TenantSettings
from loraplex.engine.transport.messages import (
    Dedicate,
    DropAutoWarm,
    Evict,
    HoldMerges,
    Holds,
    Prefetch,
    Snapshot,
)
from loraplex.errors import CapacityError, EngineUnavailableError
from loraplex.fleet.board import BoardEntry
from loraplex.fleet.link import FleetLink
from loraplex.fleet.report_cache import SEQ_KEY, DecodedReports
from loraplex.fleet.standing import FleetStanding
from loraplex.fleet.standing_restore import Restored
from loraplex.fleet.wire import ReplicaLeftError
from loraplex.residency.cache.view import CacheSummary, CopyHolds, ResidencySnapshot, Unpinned
from loraplex.residency.ledger import Tier
from loraplex.residency.stats import CacheStatsSnapshot, StageSummary
from loraplex.router.reports import MalformedReportError, ReplicaReport

_log = logging.getLogger(__name__)
SYNC_CALL_TIMEOUT_S = 30.0  # unpin / evict / snapshot wait this long for every replica
_TIER_SETS = {Tier.L0: "l0", Tier.L1: "l1", Tier.L2: "l2"}


class FleetCache:
    """``CacheControl`` over the fleet (see the module docstring)."""

    def __init__(self, link: FleetLink, restored: Restored | None = None) -> None:
        self._link = link
        # pins, warm policies, tenants: on every replica (``restored``: from the durable records)
        self._standing = FleetStanding(link, restored)
        self._reports = DecodedReports()  # the board's reports, decoded once each

    def on_adopted(self, listener: Callable[[set[tuple[AdapterKey, Tier]]], None]) -> None:
        """``FleetStanding.on_adopted``: the pins standing once the replicas' were adopted."""
        self._standing.on_adopted(listener)

    # --- reads ---------------------------------------------------------------------------

    def summary(self) -> CacheSummary:
        summaries = [e.status["summary"] for e in self._healthy()]
        if not summaries:
            raise EngineUnavailableError("no engine replica is in rotation")
        return sum_summaries(summaries)

    def is_resident(self, key: AdapterKey, tier: Tier) -> bool:
        name = _TIER_SETS.get(tier)
        if name is None:
            return False
        wanted = str(key)
        # NOTE: decoded, not read as JSON: a set of more than MAX_EXACT_KEYS travels as a Bloom
        # filter, whose JSON form holds no keys. Once per report (by its number), not per call:
        # every request asks here for its arrival tier.
        healthy = self._healthy()
        self._reports.forget_except({e.replica_id for e in healthy})
        for entry in healthy:
            report = self._decoded(entry)
            if report is not None and wanted in getattr(report.residency, name):
                return True
        return False

    def snapshot(self) -> ResidencySnapshot:
        replies: dict[str, ResidencySnapshot] = self._wait(self._link.call_each(Snapshot()))
        snapshots = list(replies.values())
        if not snapshots:
            raise EngineUnavailableError("no engine replica is in rotation")
        entries = tuple(
            replace(e, replica=replica_id) for replica_id, s in replies.items() for e in s.entries
        )
        stats = sum_stats([s.stats for s in snapshots])
        loading = sum(s.num_loading for s in snapshots)
        blocked = sum(s.num_blocked for s in snapshots)
        return ResidencySnapshot(entries, stats, loading, blocked)

    # --- changes (every healthy replica) -----------------------------------------------------

    def pin(self, key: AdapterKey, tier: Tier) -> Future[None]:
        return _all_or_unavailable(list(self._standing.pin(key, tier).values()))

    def prefetch(self, key: AdapterKey, tier: Tier) -> Future[None]:
        return _all_or_unavailable(list(self._link.call_each(Prefetch(key, tier)).values()))

    def unpin(self, key: AdapterKey, tier: Tier) -> Unpinned:
        """Every healthy replica's answer merged: lifted where any held the pin, and each warm
        policy that pins the copy still on some replica (their automatic policies differ)."""
        replies = self._wait(self._standing.unpin(key, tier)).values()
        # NOTE: a replica of an older release answers None (it says nothing of its holders)
        answers = [a for a in replies if isinstance(a, Unpinned)]
        warm = frozenset(hold for a in answers for hold in a.warm)
        return Unpinned(any(a.lifted for a in answers), warm)

    def evict(self, key: AdapterKey, tier: Tier) -> bool:
        return any(self._wait(self._link.call_each(Evict(key, tier))).values())

    def holds(self, key: AdapterKey, tier: Tier) -> CopyHolds:
        """Every healthy replica's merged: what keeps the copy on any of them."""
        replies = self._wait(self._link.call_each(Holds(key, tier))).values()
        answers = [a for a in replies if isinstance(a, CopyHolds)]  # another kind names nothing
        return CopyHolds(
            resident=any(a.resident for a in answers),
            pinned=any(a.pinned for a in answers),
            warm=frozenset(hold for a in answers for hold in a.warm),
            in_use=sum(a.in_use for a in answers),
            loading=any(a.loading for a in answers),
        )

    def set_warm_policy(self, key: AdapterKey, warm: WarmPolicy | None) -> None:
        self._wait(self._standing.set_warm(key, warm))

    def drop_auto_warm(self, key: AdapterKey) -> None:
        """On every healthy replica; nothing standing (a joining replica has no rates)."""
        self._wait(self._link.call_each(DropAutoWarm(key)))

    def update_tenant_settings(self, settings: Mapping[str, TenantSettings]) -> None:
        """Every tenant's settings to every replica (the admin API changed a tenant)."""
        self._wait(self._standing.update_tenants(dict(settings)))

    # --- internals -----------------------------------------------------------------------

    def _decoded(self, entry: BoardEntry) -> ReplicaReport | None:
        """``entry``'s report (None: refused, logged when first seen)."""
        status = entry.status
        try:
            return self._reports.decode(entry.replica_id, status.get(SEQ_KEY), status.get("report"))
        except MalformedReportError as exc:
            _log.warning("replica %s posted a malformed report: %s", entry.replica_id, exc)
            return None

    def _healthy(self) -> list[BoardEntry]:
        return [e for e in self._link.entries() if e.healthy]

    def _wait(self, futures: dict[str, Future[Any]]) -> dict[str, Any]:
        """Each replica's answer; one that had left (``ReplicaLeftError``) is left out, unless
        every one had."""
        replies: dict[str, Any] = {}
        left: ReplicaLeftError | None = None
        for rid, future in futures.items():
            try:
                replies[rid] = future.result(SYNC_CALL_TIMEOUT_S)
            except ReplicaLeftError as exc:
                left = exc
        if left is not None and not replies:
            raise left
        return replies


def _all_or_unavailable(futures: list[Future[None]]) -> Future[None]:
    """Done when every one of ``futures`` is, one of a replica that had left
    (``ReplicaLeftError``) counting as done; failed with the first other failure, and at once
    when there is none (no replica is in rotation) or when every one had left."""
    combined: Future[None] = Future()
    if not futures:
        combined.set_exception(EngineUnavailableError("no engine replica is in rotation"))
        return combined
    remaining = [len(futures)]
    present = [0]
    lock = threading.Lock()

    def on_done(done: Future[None]) -> None:
        error = done.exception()
        with lock:
            remaining[0] -= 1
            if combined.done():
                return
            if error is not None and not isinstance(error, ReplicaLeftError):
                combined.set_exception(error)
                return
            present[0] += error is None
            if remaining[0] == 0:
                if present[0]:
                    combined.set_result(None)
                else:  # every replica it went to had left
                    combined.set_exception(error or EngineUnavailableError("no replica left"))

    for future in futures:
        future.add_done_callback(on_done)
    return combined


def sum_stats(stats: list[CacheStatsSnapshot]) -> CacheStatsSnapshot:
    """The fleet's cache counters: per-replica counters summed; stage timings merged by
    ``merge_stages``."""

    def add(field: str) -> dict[Any, int]:
        total: Counter[Any] = Counter()
        for s in stats:
            total.update(getattr(s, field))
        return dict(total)

    stages: dict[Any, list[StageSummary]] = {}
    for s in stats:
        for stage, summary in s.stages.items():
            stages.setdefault(stage, []).append(summary)
    waits = [s.room_wait for s in stats if s.room_wait is not None]
    return CacheStatsSnapshot(
        hits=add("hits"),
        misses=sum(s.misses for s in stats),
        loads=add("loads"),
        evictions=add("evictions"),
        reloads_after_eviction=add("reloads_after_eviction"),
        load_failures=sum(s.load_failures for s in stats),
        resident_count=add("resident_count"),
        resident_bytes=add("resident_bytes"),
        stages={stage: merge_stages(parts) for stage, parts in stages.items()},
        room_wait=merge_stages(waits) if waits else None,
        thrash_events=add("thrash_events"),
    )


def merge_stages(parts: list[StageSummary]) -> StageSummary:
    """Counts and seconds summed; the percentiles and maximum are the largest replica's (an
    upper bound: percentiles of different replicas' samples do not combine exactly)."""
    return StageSummary(
        count=sum(p.count for p in parts),
        total_s=sum(p.total_s for p in parts),
        p50_s=max(p.p50_s for p in parts),
        p95_s=max(p.p95_s for p in parts),
        max_s=max(p.max_s for p in parts),
    )


def sum_summaries(summaries: list[CacheSummary]) -> CacheSummary:
    """The fleet's cache summary: counters and per-tier totals summed over replicas."""

    def add(field: str) -> dict[Tier, int]:
        total: Counter[Tier] = Counter()
        for s in summaries:
            total.update(getattr(s, field))
        return dict(total)

    return CacheSummary(
        stats=sum_stats([s.stats for s in summaries]),
        num_loading=sum(s.num_loading for s in summaries),
        num_blocked=sum(s.num_blocked for s in summaries),
        used_bytes=add("used_bytes"),
        capacity_bytes=add("capacity_bytes"),
        num_copies=add("num_copies"),
        default_tenant_bytes=add("default_tenant_bytes"),
    )


class FleetMergeHolds:
    """Merge holds on every healthy replica (``engine.merge_holds.MergeHoldControl``): a hold
    answers the revisions merged on any of them. A replica that cannot answer fails the hold
    (the admin action is refused), since its merge could not be ruled out. A release goes to
    exactly the replicas the hold reached: a release elsewhere would drop another's hold."""

    def __init__(self, link: FleetLink) -> None:
        self._link = link
        self._lock = threading.Lock()
        self._reached: dict[frozenset[str], list[list[str]]] = {}  # refs -> replica ids, per hold

    def hold(self, refs: frozenset[str]) -> frozenset[str]:
        futures = self._link.call_each(HoldMerges(refs, hold=True))
        merged: set[str] = set()
        asking = ""  # the replica whose answer is awaited
        try:
            for replica_id in sorted(futures):
                asking = replica_id
                merged |= futures[replica_id].result(SYNC_CALL_TIMEOUT_S)
        except Exception as exc:
            self._release_on(refs, sorted(futures))
            # NOTE: not EngineUnavailableError, which the guard reads as "nothing can merge"
            raise CapacityError(
                f"replica {asking} could not hold {sorted(refs)} against merging: {exc}"
            ) from exc
        with self._lock:
            self._reached.setdefault(refs, []).append(sorted(futures))
        return frozenset(merged)

    def release(self, refs: frozenset[str]) -> None:
        with self._lock:
            holds = self._reached.get(refs, [])
            replica_ids = holds.pop() if holds else []
            if not holds:
                self._reached.pop(refs, None)
        self._release_on(refs, replica_ids)

    def _release_on(self, refs: frozenset[str], replica_ids: list[str]) -> None:
        """NOTE: a replica that cannot be reached keeps its hold (it stays unmerged for these
        revisions, the safe side); a restarted one has no holds anyway."""
        futures = self._link.call_each(HoldMerges(refs, hold=False), replica_ids)
        for replica_id, future in futures.items():
            try:
                future.result(SYNC_CALL_TIMEOUT_S)
            except Exception:
                _log.warning(
                    "merge holds on %s not released on replica %s", sorted(refs), replica_id
                )

    def dedicate(self, replica_id: str, adapter_key: str | None) -> Future[Any]:
        """``FleetTopology``'s ``ask``: replica ``replica_id``'s ``auto`` mode is to merge
        ``adapter_key`` (a routing key, ``str(AdapterKey)``; None: decide alone again)."""
        ref = None if adapter_key is None else adapter_key.split("#", 1)[0]
        return self._link.call(replica_id, Dedicate(ref))
