"""The waiter side of a load: handing out leases, deadlines and abandonment.

Torch-free. A finished job settles every waiter (a lease for acquirers, None for prefetchers;
a lease granted to a waiter that just gave up is handed straight back). A waiter leaves its
job in two other ways: its deadline passes
(the future fails with CapacityError) or its future is cancelled. When the last waiter leaves,
the job is aborted through ``abort`` (the flow then cancels it now or when its running phase
returns). Timer and done-callbacks arrive on other threads and retake the cache's lock.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from loraplex.artifacts.identity import AdapterKey
from loraplex.errors import CapacityError, LoadCancelledError
from loraplex.residency.cache.cache_lock import CacheLock
from loraplex.residency.cache.executors import StepExecutor
from loraplex.residency.cache.jobs import JobTable, LoadJob, Waiter, settle
from loraplex.residency.cache.tier_state import TierState
from loraplex.residency.ledger import Tier
from loraplex.residency.pipeline import LoadResult


class WaiterDesk:
    """Settles the waiters of one cache's jobs: results, deadlines and cancellations."""

    def __init__(
        self,
        state: TierState,
        lock: CacheLock,
        jobs: JobTable,
        executor: StepExecutor,
        abort: Callable[[LoadJob, BaseException], None],
    ) -> None:
        self._state = state
        self._lock = lock
        self._jobs = jobs
        self._executor = executor
        self._abort = abort

    def hand_out(self, job: LoadJob, on_release: Callable[[AdapterKey], None]) -> None:
        """Settles every waiter of a finished job (its L0 copy, if any, is ready)."""
        entry = self._state.ready_entry(job.key, Tier.L0)
        for waiter in job.waiters:
            if waiter.wants_lease and entry is not None:
                load = LoadResult(job.key, waiter.source, dict(job.seconds), job.room_wait_s)
                if not settle(waiter.future, result=self._state.grant(entry, load, on_release)):
                    entry.refcount -= 1
            elif waiter.wants_lease:
                error = CapacityError(f"{job.key.ref} left L0 before its lease")
                settle(waiter.future, error=error)
            else:
                settle(waiter.future, result=None)

    def watch(self, job: LoadJob, waiter: Waiter, deadline_at_s: float | None) -> None:
        """Fails ``waiter`` at ``deadline_at_s`` (clock time) unless settled first, and abandons
        it when its future is cancelled. A settled waiter's timer is cancelled, so a real
        executor keeps no sleeping timer per finished acquire."""
        timer = None
        if deadline_at_s is not None:
            timer = self._executor.call_at(deadline_at_s, lambda: self._expire(job, waiter))

        def settled(future: Future[Any]) -> None:  # one callback: the timer, then abandonment
            if timer is not None:
                timer.cancel()
            self._abandon(job, future)

        waiter.future.add_done_callback(settled)

    def _expire(self, job: LoadJob, waiter: Waiter) -> None:
        with self._lock:
            if waiter.future.done() or waiter not in job.waiters:
                return
            state = "waiting for room" if self._jobs.is_blocked(job) else "loading"
            error = CapacityError(
                f"adapter {job.key.ref}: deadline passed while {state} (tier budgets full of "
                "pinned or in-use adapters, or loads queued)"
            )
            settle(waiter.future, error=error)
            if self._jobs.drop_waiter(job, waiter.future):
                self._abort(job, LoadCancelledError(f"load of {job.key.ref} cancelled: no waiters"))

    def _abandon(self, job: LoadJob, future: Future[Any]) -> None:
        if not future.cancelled():
            return
        with self._lock:
            if self._jobs.drop_waiter(job, future):
                self._abort(job, LoadCancelledError(f"load of {job.key.ref} abandoned"))
