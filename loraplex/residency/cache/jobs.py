"""Load jobs, their waiters and leases, and the job table that bounds them.

Torch-free. One ``LoadJob`` per adapter key in flight (single flight): every acquirer and
prefetcher of that key attaches a ``Waiter`` to it. ``JobTable`` owns the jobs, the queue of
jobs waiting for a load permit, the jobs blocked waiting for room and the per-tenant counts of
started loads; everything here is mutated only under the cache's lock.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from loraplex.artifacts.identity import AdapterKey
from loraplex.residency.cache.executors import TimerHandle
from loraplex.residency.ledger import ResidentEntry, Tier, TierLedger, require_invariant
from loraplex.residency.pipeline import CancelToken, Footprint, LoadResult, Move, Prepared
from loraplex.residency.stats import Stage


class Lease:
    """An adapter held in an L0 slot while a request uses it; release exactly once (idempotent).

    Use as a context manager, or call ``release()``. The slot stays valid until release.
    """

    def __init__(
        self,
        key: AdapterKey,
        slot: int,
        load: LoadResult,
        on_release: Callable[[AdapterKey], None],
    ) -> None:
        self.key = key  # the adapter revision
        self.slot = slot  # the L0 slot its weights are in
        self.load = load  # how it got there (source tier, per-stage seconds)
        self._on_release = on_release
        self._released = False
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        self._on_release(self.key)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def settle(
    future: Future[Any], *, result: object = None, error: BaseException | None = None
) -> bool:
    """Completes a waiter's future exactly once; False when it was already cancelled or
    completed (a lease granted to a waiter that just gave up is then handed straight back)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        return False
    return True


@dataclass
class Waiter:
    """One acquirer or prefetcher of a job."""

    future: Future[Any]  # a Lease for acquirers, None for prefetchers
    wants_lease: bool  # acquirer (needs L0 and a refcount) vs prefetcher
    source: Tier  # the tier it hit (for LoadResult)
    asked_at_s: float | None = None  # clock time an acquirer asked (deferral budget); else None


@dataclass
class LoadJob:
    """State of one in-flight load (mutated only under the cache's lock)."""

    key: AdapterKey  # the adapter revision
    target: Tier  # the fastest tier any waiter needs
    optional: bool  # prefetch/promotion only: may be refused by the policy, never waits for room
    # the tenant its room is charged to (``ResidentEntry.charged``): the requester that started
    # it, the owner once the owner asks too; "" in the constructor: the owner
    charged: str = ""
    # the tenant whose load permit it holds (``JobTable``'s per-tenant bound): its charge when
    # it started; a later move of the charge leaves the permit where it was taken
    permit: str = ""
    waiters: list[Waiter] = field(default_factory=list)  # who is waiting
    cancel: CancelToken = field(default_factory=CancelToken)  # set when nobody waits any more
    footprint: Footprint | None = None  # known after resolve
    move: Move | None = None  # the move in progress
    prepared: Prepared | None = None  # staged bytes of the current move
    source_entry: ResidentEntry | None = None  # the copy being read (refcount held)
    reserved: ResidentEntry | None = None  # room taken in move.target, not ready yet
    started: bool = False  # out of the queue (counts against the concurrency bounds)
    blocked_since_s: float | None = None  # waiting for room since
    defer_timer: TimerHandle | None = None  # retries a deferred placement (policy deferral)
    seconds: dict[Stage, float] = field(default_factory=dict)  # accumulated stage durations
    room_wait_s: float = 0.0  # seconds spent waiting for room (not a pipeline stage)
    # NOTE: `busy` is True while a phase runs off-lock; deadline expiry then only sets `cancel`
    # and the phase's completion undoes the job.
    busy: bool = False

    def __post_init__(self) -> None:
        if not self.charged:
            self.charged = self.key.tenant

    @property
    def has_acquirer(self) -> bool:
        return any(w.wants_lease for w in self.waiters)

    def waited_s(self, now_s: float) -> float:
        """Seconds this job has waited for room in its target tier."""
        return 0.0 if self.blocked_since_s is None else now_s - self.blocked_since_s

    def request_waited_s(self, now_s: float) -> float:
        """Seconds the longest-waiting acquirer has waited since it asked (queue, earlier moves
        and room included): the clock of the per-request deferral bound. Without a timed
        acquirer, the room wait of the current move."""
        asked = [w.asked_at_s for w in self.waiters if w.wants_lease and w.asked_at_s is not None]
        return now_s - min(asked) if asked else self.waited_s(now_s)

    def release_source(self) -> None:
        """Lets go of the copy the current move was reading."""
        if self.source_entry is not None:
            self.source_entry.refcount -= 1
            self.source_entry = None

    def add_seconds(self, seconds: Mapping[Stage, float]) -> None:
        for stage, value in seconds.items():
            self.seconds[stage] = self.seconds.get(stage, 0.0) + value


class JobTable:
    """The loads in flight: one job per key, a FIFO of jobs not started, the jobs blocked for
    room, and started loads per tenant (bounded globally and per tenant).

    A load counts against the per-tenant bound of the tenant it is charged to when it starts
    (``LoadJob.charged``): the requester, which for a call of another tenant's public adapter
    is the caller, not the owner. NOTE: counted under the owner, a caller's burst of calls of
    the owner's public adapters took the owner's permits and the owner's own loads queued."""

    def __init__(self, max_loads: int, tenant_max_loads: int) -> None:
        self._max_loads = max_loads
        self._tenant_max_loads = tenant_max_loads
        self._jobs: dict[AdapterKey, LoadJob] = {}
        self._queue: deque[LoadJob] = deque()
        self._blocked: list[LoadJob] = []
        self._running: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._jobs)

    def get(self, key: AdapterKey) -> LoadJob | None:
        return self._jobs.get(key)

    def is_live(self, job: LoadJob) -> bool:
        return self._jobs.get(job.key) is job

    @property
    def num_blocked(self) -> int:
        return len(self._blocked)

    def running(self) -> dict[str, int]:
        """Started loads per tenant (a copy)."""
        return dict(self._running)

    def add(self, job: LoadJob) -> None:
        self._jobs[job.key] = job
        self._queue.append(job)

    def start_now(self, job: LoadJob) -> bool:
        """Adds ``job`` already started when ``add`` then ``start_next`` would start it at once
        (no job queued before it, both bounds leave room); False: nothing added."""
        if (
            self._queue
            or sum(self._running.values()) >= self._max_loads
            or self._running.get(job.charged, 0) >= self._tenant_max_loads
        ):
            return False
        self._jobs[job.key] = job
        self._start(job)
        return True

    def start_next(self) -> Iterator[LoadJob]:
        """Takes queued jobs out of the queue in FIFO order while the bounds allow, skipping
        tenants at their own bound; each yielded job is counted as started. A job started or
        retired meanwhile (a nested pump: a job yielded here may fail or finish at once and pump
        again) is skipped."""
        if not self._queue:  # the common case: every load started at once
            return
        for job in list(self._queue):
            if job.started or self._jobs.get(job.key) is not job:
                continue
            if sum(self._running.values()) >= self._max_loads:
                return
            if self._running.get(job.charged, 0) >= self._tenant_max_loads:
                continue
            self._queue.remove(job)
            self._start(job)
            yield job

    def _start(self, job: LoadJob) -> None:
        """Counts ``job`` as started, against the load permits of the tenant charged now."""
        job.started = True
        job.permit = tenant = job.charged
        self._running[tenant] = self._running.get(tenant, 0) + 1

    def is_blocked(self, job: LoadJob) -> bool:
        return job in self._blocked

    def block(self, job: LoadJob) -> None:
        if job not in self._blocked:
            self._blocked.append(job)

    def unblock(self, job: LoadJob) -> None:
        if job in self._blocked:
            self._blocked.remove(job)

    def blocked(self) -> list[LoadJob]:
        """The blocked jobs, oldest first (a copy: retrying one may unblock others)."""
        return list(self._blocked)

    def drop_waiter(self, job: LoadJob, future: Future[Any]) -> bool:
        """Removes the waiter holding ``future`` from a live ``job``; True when that left the job
        without waiters (the caller aborts it). A job that already ended is left alone: a later
        load of the same key is not the one the waiter attached to."""
        if not self.is_live(job):
            return False
        job.waiters = [w for w in job.waiters if w.future is not future]
        return not job.waiters

    def retire(self, job: LoadJob) -> None:
        """Forgets ``job`` everywhere and returns its load permit."""
        if self._jobs.get(job.key) is job:
            del self._jobs[job.key]
        if job in self._queue:
            self._queue.remove(job)
        self.unblock(job)
        if job.started:
            job.started = False
            left = self._running[job.permit] - 1
            if left:
                self._running[job.permit] = left
            else:
                del self._running[job.permit]

    def check(self, ledgers: Mapping[Tier, TierLedger]) -> None:
        """Job-side invariants: bounded concurrency, live queued and blocked jobs, reserved
        entries owned by their job, and lower-tier refcounts equal to the loads reading them."""
        started = [j for j in self._jobs.values() if j.started]
        permits = Counter(j.permit for j in started)
        require_invariant(
            self._running == dict(permits),
            "running loads counted per permit",
            f"{self._running} vs {dict(permits)} started",
        )
        require_invariant(len(started) <= self._max_loads, "global load bound", f"{len(started)}")
        for tenant, count in self._running.items():
            require_invariant(0 < count <= self._tenant_max_loads, "per-tenant load bound", tenant)
        for job in [*self._queue, *self._blocked]:
            require_invariant(self.is_live(job), "queued and blocked loads are live", job.key.ref)
        readers: dict[tuple[AdapterKey, Tier], int] = {}
        for job in self._jobs.values():
            if job.source_entry is not None:
                ident = (job.key, job.source_entry.tier)
                readers[ident] = readers.get(ident, 0) + 1
            if job.reserved is not None:
                owner = ledgers[job.reserved.tier].get(job.key)
                require_invariant(
                    owner is job.reserved, "reserved room owned by its load", job.key.ref
                )
        for tier, ledger in ledgers.items():
            for entry in ledger.entries.values():
                self._check_entry(tier, entry, readers)

    def _check_entry(
        self, tier: Tier, entry: ResidentEntry, readers: Mapping[tuple[AdapterKey, Tier], int]
    ) -> None:
        where = f"{entry.key.ref} in {tier.name}"
        if not entry.ready:
            loader = self._jobs.get(entry.key)
            ok = loader is not None and loader.reserved is entry
            require_invariant(ok, "unready entries are loading", where)
        elif tier is not Tier.L0:
            expected = readers.get((entry.key, tier), 0)
            require_invariant(
                entry.refcount == expected,
                "lower-tier refcounts equal readers",
                f"{where}: {entry.refcount} != {expected}",
            )
