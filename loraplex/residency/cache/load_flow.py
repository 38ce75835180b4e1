"""LoadFlow: single-flight, bounded, cancellable loads driven as a state machine.

Torch-free. Per job: queued -> resolve -> per move towards the target: prepare (off-lock) ->
place (pure ``placement.decide``, applied here) -> install (off-lock) -> ... -> hand out leases.
Copies and tier facts are ``TierState``'s, jobs ``JobTable``'s. Phases are submitted once the
lock is released (``CacheLock.later``, behind drops queued before them); callbacks retake it.
A failed or cancelled load undoes its current move (reserved entry, staged bytes, source
refcount) and hands every waiter the typed error; committed moves stay (verified copies).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from typing import Any

from loraplex.artifacts.identity import AdapterKey
from loraplex.errors import (
    AdapterTooLargeError,
    CacheIntegrityError,
    CorruptArtifactError,
    DigestMismatchError,
    LoadCancelledError,
    TensorValidationError,
)
from loraplex.residency.cache.cache_lock import CacheLock
from loraplex.residency.cache.executors import StepExecutor
from loraplex.residency.cache.failure_log import FailureLog
from loraplex.residency.cache.jobs import JobTable, LoadJob, Waiter, settle
from loraplex.residency.cache.placement import Block, Defer, Demand, Fail, Place, decide
from loraplex.residency.cache.room import TierRoom
from loraplex.residency.cache.tier_state import TierState
from loraplex.residency.cache.waiters import WaiterDesk
from loraplex.residency.ledger import Tier
from loraplex.residency.pipeline import CancelToken, LoadPipeline, Move, Prepared, Resolved
from loraplex.residency.stats import Stage

# A copy that fails these checks while being read is bad at rest, not in transit.
_INTEGRITY_ERRORS = (CorruptArtifactError, DigestMismatchError, TensorValidationError)
# An L1 -> L0 move's staging when the pipeline stages nothing for it (``prepares_l0`` False).
_NOTHING_STAGED = Prepared(None, {})
# A deferred load re-evaluates at least this often: the young copy it waits for may age into a
# victim without any release or load event to wake it.
DEFER_RECHECK_S = 0.1


class LoadFlow:
    """Single-flight, bounded, cancellable loads for one cache."""

    def __init__(
        self,
        state: TierState,
        jobs: JobTable,
        lock: CacheLock,
        pipeline: LoadPipeline,
        executor: StepExecutor,
    ) -> None:
        self._state = state
        self._jobs = jobs
        self._lock = lock
        self._pipeline = pipeline
        self._executor = executor
        self._waiters = WaiterDesk(state, lock, jobs, executor, self.abort)
        self._retrying = False
        self._retry_again = False
        self._failures = FailureLog(state.clock)

    # --- entry points (under the lock) ---------------------------------------------------------

    def attach(
        self,
        key: AdapterKey,
        target: Tier,
        waiter: Waiter,
        *,
        optional: bool,
        deadline_at_s: float | None,
        charged: str | None = None,
    ) -> None:
        """Adds ``waiter`` to the load of ``key`` (starting one) towards ``target``;
        ``deadline_at_s`` is a clock time, None: no deadline. A load it starts is charged to
        ``charged`` (None: the owner); one under way keeps its charge, which only the owner's
        ask moves (``TierState.charge_owner``)."""
        job = self._jobs.get(key)
        if job is None:
            job = LoadJob(key, target, optional, charged=charged or key.tenant)
            if self._fill_free_slot(job, waiter, deadline_at_s):
                return
            self._jobs.add(job)
        elif job.cancel.cancelled:
            # A phase abandoned by earlier waiters is still running: it restarts for this one.
            job.cancel = CancelToken()
        job.target = min(job.target, target)
        job.optional = job.optional and optional
        job.waiters.append(waiter)
        self._waiters.watch(job, waiter, deadline_at_s)
        self._pump()

    def load_into(
        self, key: AdapterKey, tier: Tier, *, optional: bool, charged: str | None = None
    ) -> Future[None]:
        """A load of ``key`` into ``tier`` (``attach``; ``charged``: a load it starts is
        charged to that tenant, None: the owner); done at once when a ready copy is there."""
        future: Future[None] = Future()
        if self._state.ready_entry(key, tier) is not None:
            future.set_result(None)
            return future
        self._state.history_of(key)
        waiter = Waiter(future, wants_lease=False, source=self._state.source_tier(key, tier))
        self.attach(key, tier, waiter, optional=optional, deadline_at_s=None, charged=charged)
        return future

    def cancel(self, key: AdapterKey) -> bool:
        job = self._jobs.get(key)
        if job is None:
            return False
        error = LoadCancelledError(f"load of {key.ref} cancelled")
        waiters, job.waiters = job.waiters, []
        for waiter in waiters:
            settle(waiter.future, error=error)
        self.abort(job, error)
        return True

    def release(self, key: AdapterKey) -> None:
        """A lease on ``key`` ended (the Lease's callback; takes the lock)."""
        with self._lock:
            entry = self._state.ready_entry(key, Tier.L0)
            if entry is None or entry.refcount <= 0:
                raise CacheIntegrityError("leases match refcounts", f"release of {key.ref}")
            entry.refcount -= 1
            self.retry_blocked()

    def retry_blocked(self) -> None:
        """Gives every load waiting for room another try (after anything freed capacity)."""
        if self._retrying:
            self._retry_again = True
            return
        self._retrying = True
        try:
            again = True
            while again:
                self._retry_again = False
                for job in self._jobs.blocked():
                    if self._jobs.is_blocked(job):
                        self._place(job)
                again = self._retry_again
        finally:
            self._retrying = False

    def abort(self, job: LoadJob, error: BaseException) -> None:
        """Nobody waits any more: cancel now, or when the running phase returns."""
        job.cancel.cancel()
        if not job.busy:
            self._fail(job, error)

    # --- the state machine ---------------------------------------------------------------------

    def _fill_free_slot(self, job: LoadJob, waiter: Waiter, deadline_at_s: float | None) -> bool:
        """The short path of a new load whose next move is its L1 copy into a free L0 slot
        with nothing to prepare (``prepares_l0`` False): when the job would start at once
        (``JobTable.start_now``), its footprint is known and the copy fits in free room
        (``fits_free``: no victim, admissible), the room is taken and the install submitted
        here, with the same effects as queue -> start -> next phase -> empty prepare ->
        ``decide`` (Place, no victims) -> install, minus those steps. False: nothing done,
        the general path runs. The install's completion, leases, deadlines and cancellation
        are the general path's."""
        state, key = self._state, job.key
        if job.target is not Tier.L0 or self._pipeline.prepares_l0:
            return False
        resolved = state.footprint_of(key)
        source = state.ready_entry(key, Tier.L1)
        if resolved is None or source is None or key in state.ledgers[Tier.L0].entries:
            return False
        size = resolved.footprint.slot_bytes
        if not state.ledgers[Tier.L0].fits_free(job.charged, size):
            return False
        if not self._jobs.start_now(job):
            return False
        job.waiters.append(waiter)
        self._waiters.watch(job, waiter, deadline_at_s)
        job.footprint = resolved.footprint
        move = job.move = Move(key, Tier.L1, Tier.L0)
        job.source_entry = source
        source.refcount += 1
        job.prepared = prepared = _NOTHING_STAGED
        job.reserved = state.reserve(Tier.L0, key, size, job.charged)
        state.stats.record_room_wait(0.0)
        install = partial(self._pipeline.install, move, prepared, job.reserved.slot, job.cancel)
        self._run(job, install, self._on_installed)
        return True

    def _pump(self) -> None:
        for job in self._jobs.start_next():
            self._next_phase(job)

    def _next_phase(self, job: LoadJob) -> None:
        if job.cancel.cancelled:
            self._fail(job, LoadCancelledError(f"load of {job.key.ref} cancelled"))
            return
        resolved = self._state.footprint_of(job.key)
        if resolved is None:
            self._run(job, partial(self._pipeline.resolve, job.key, job.cancel), self._on_resolved)
            return
        job.footprint = resolved.footprint
        move = self._state.next_move(job.key, job.target)
        if move is None:
            self._finish(job)
            return
        try:
            size = resolved.footprint.bytes_in(move.target)
            self._state.ledgers[move.target].check_admissible(job.charged, size)
        except AdapterTooLargeError as error:
            self._fail(job, error)
            return
        job.move = move
        if move.source is not Tier.L3:
            job.source_entry = self._state.ledgers[move.source].entries[job.key]
            job.source_entry.refcount += 1
        if move.target is Tier.L0 and not self._pipeline.prepares_l0:
            self._on_prepared(job, _NOTHING_STAGED)  # nothing to stage: place it now
            return
        self._run(job, partial(self._pipeline.prepare, move, job.cancel), self._on_prepared)

    def _on_resolved(self, job: LoadJob, result: Resolved) -> None:
        self._record(job, result.seconds)
        self._state.remember_footprint(job.key, result)
        self._next_phase(job)

    def _on_prepared(self, job: LoadJob, result: Prepared) -> None:
        job.prepared = result
        self._record(job, result.seconds)
        job.blocked_since_s = self._state.clock.now()
        self._place(job)

    def _place(self, job: LoadJob) -> None:
        """Decides where the prepared move goes (``placement.decide``) and applies it."""
        move, footprint, prepared = job.move, job.footprint, job.prepared
        if move is None or footprint is None or prepared is None or job.busy:
            return
        now = self._state.clock.now()
        waited_s = job.waited_s(now)
        demand = Demand(job.key.ref, move.target, job.optional, job.has_acquirer)
        room = TierRoom(self._state, move, footprint, job.request_waited_s(now), job.charged)
        placement = decide(demand, room)
        if isinstance(placement, Defer):
            self._defer(job, placement.seconds)
        elif isinstance(placement, Block):
            self._jobs.block(job)
        elif isinstance(placement, Fail):
            self._fail(job, placement.error)
        elif isinstance(placement, Place):
            self._jobs.unblock(job)
            for victim in placement.victims:
                self._state.evict(victim, drop=False)
            size = footprint.bytes_in(move.target)
            job.reserved = self._state.reserve(move.target, job.key, size, job.charged)
            for victim in placement.victims:
                # A victim's slot handed straight to this install is not cleared first: the
                # install replaces its weights (one re-publication of the slot's tables, not
                # two); an install that never happens drops the slot, which clears it.
                if victim.slot is None or victim.slot != job.reserved.slot:
                    self._state.drop_evicted(victim)
            job.room_wait_s += waited_s
            self._state.stats.record_room_wait(waited_s)
            install = partial(self._pipeline.install, move, prepared, job.reserved.slot, job.cancel)
            self._run(job, install, self._on_installed)

    def _defer(self, job: LoadJob, wait_s: float) -> None:
        """Blocks ``job`` for up to ``wait_s``: a release retries it sooner, a timer at the
        latest after DEFER_RECHECK_S (a copy too young to evict ages without an event)."""
        self._jobs.block(job)
        if job.defer_timer is None:
            at = self._state.clock.now() + min(wait_s, DEFER_RECHECK_S)
            job.defer_timer = self._executor.call_at(at, lambda: self._retry_deferred(job))

    def _retry_deferred(self, job: LoadJob) -> None:
        """The timer of one deferred job: only that job looks again (a release retries all)."""
        with self._lock:
            job.defer_timer = None
            if self._jobs.is_blocked(job):
                self._place(job)

    def _on_installed(self, job: LoadJob, seconds: dict[Stage, float]) -> None:
        entry, move, prepared = job.reserved, job.move, job.prepared
        if entry is None or move is None or prepared is None:
            raise CacheIntegrityError("installs follow placements", job.key.ref)
        self._record(job, seconds)
        self._state.mark_ready(entry)
        job.reserved = job.prepared = job.move = None
        job.release_source()
        state = self._state
        state.stats.record_load(move.target, state.history_of(job.key), state.clock.now())
        move_s = sum(prepared.seconds.values()) + sum(seconds.values())
        if job.footprint is not None:
            state.costs.measured(move, job.footprint.bytes_in(move.source), move_s)
        if move.target is job.target and not job.cancel.cancelled:
            self._finish(job)  # what _next_phase finds: the target holds a ready copy now
            return
        self._next_phase(job)

    def _finish(self, job: LoadJob) -> None:
        self._jobs.retire(job)
        self._waiters.hand_out(job, self.release)
        self._pump()
        self.retry_blocked()

    def _fail(self, job: LoadJob, error: BaseException) -> None:
        move = job.move
        self._undo_move(job)
        if move is not None and isinstance(error, _INTEGRITY_ERRORS):
            self._state.drop_corrupt(job.key, move.source)
        self._jobs.retire(job)
        self._state.stats.load_failures += 1
        self._failures.failed(job.key, error)
        for waiter in job.waiters:
            settle(waiter.future, error=error)
        self._state.settle_key(job.key)
        self._pump()
        self.retry_blocked()

    # --- helpers ---------------------------------------------------------------------------

    def _run(
        self, job: LoadJob, work: Callable[[], Any], then: Callable[[LoadJob, Any], None]
    ) -> None:
        """Runs ``work`` off-lock once the lock is released, then ``then`` under the lock."""
        job.busy = True

        def done(result: object) -> None:
            with self._lock:
                job.busy = False
                if isinstance(result, Prepared):
                    job.prepared = result  # the job owns it now: any undo discards it
                if (
                    isinstance(result, LoadCancelledError)
                    and job.waiters
                    and not job.cancel.cancelled
                ):
                    self._undo_move(job)
                    self._next_phase(job)
                elif isinstance(result, BaseException):
                    self._fail(job, result)
                elif job.cancel.cancelled and not job.waiters:
                    self._fail(job, LoadCancelledError(f"load of {job.key.ref} cancelled"))
                else:
                    then(job, result)

        self._lock.later(partial(self._executor.run, work, done))

    def _undo_move(self, job: LoadJob) -> None:
        if job.reserved is not None:
            self._state.remove(job.reserved)
        if job.prepared is not None and job.move is not None:
            self._lock.later(partial(self._pipeline.discard, job.move, job.prepared))
        job.release_source()
        job.reserved = job.prepared = job.move = None

    def _record(self, job: LoadJob, seconds: dict[Stage, float]) -> None:
        job.add_seconds(seconds)
        for stage, value in seconds.items():
            self._state.stats.record_stage(stage, value)
