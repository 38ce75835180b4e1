"""The load state machine of the adapter cache: queue -> resolve -> (prepare -> place -> install)*.

Torch-free. Every method runs under the cache's lock; phases run on the executor and come
back through ``_done`` callbacks that retake it. Tier decisions (which move next, which
victims, whether an optional load is admitted) are asked of the cache, never made here.

Undo rule: a failed or cancelled load removes its reserved entry (and whatever the install
wrote), discards its staged bytes, releases the copy it was reading, and hands every waiter
the typed error. Moves already committed stay: they are complete, verified copies.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from loraplex.artifacts.identity import AdapterKey
from loraplex.errors import (
    CacheIntegrityError,
    CapacityError,
    CorruptArtifactError,
    DigestMismatchError,
    LoadCancelledError,
    TensorValidationError,
)
from loraplex.residency.cache.jobs import LoadJob, StepExecutor, Waiter
from loraplex.residency.cache.waiters import abandoner, hand_out, settle, watch_deadline
from loraplex.residency.ledger import ResidentEntry, Tier
from loraplex.residency.pipeline import CancelToken, LoadPipeline, Prepared, Resolved
from loraplex.residency.stats import AdapterHistory, Stage

if TYPE_CHECKING:
    from loraplex.residency.cache.tiered_cache import TieredAdapterCache


# A copy that fails these checks while being read is bad at rest, not in transit.
_INTEGRITY_ERRORS = (CorruptArtifactError, DigestMismatchError, TensorValidationError)
# A deferred load re-evaluates at least this often: the young copy it waits for may age into a
# victim without any release or load event to wake it.
DEFER_RECHECK_S = 0.1


class LoadFlow:
    """Single-flight, bounded, cancellable loads for one cache."""

    def __init__(
        self, cache: TieredAdapterCache, pipeline: LoadPipeline, executor: StepExecutor
    ) -> None:
        self.cache = cache
        self.pipeline = pipeline
        self.executor = executor
        self.jobs: dict[AdapterKey, LoadJob] = {}  # one per key in flight (single flight)
        self.queue: deque[LoadJob] = deque()  # not started: waiting for a load permit
        self.blocked: list[LoadJob] = []  # prepared, waiting for room in their target tier
        self.running: dict[str, int] = {}  # started loads per tenant
        self.footprints: dict[AdapterKey, Resolved] = {}  # resolve once per key
        self._retrying = False
        self._retry_again = False

    # --- entry points ------------------------------------------------------------------------

    def attach(
        self,
        key: AdapterKey,
        target: Tier,
        waiter: Waiter,
        *,
        optional: bool,
        deadline_s: float | None,
    ) -> None:
        job = self.jobs.get(key)
        if job is None:
            job = LoadJob(key, target, optional)
            self.jobs[key] = job
            self.queue.append(job)
        elif job.cancel.cancelled:
            # A phase abandoned by earlier waiters is still running: it restarts for this one.
            job.cancel = CancelToken()
        job.target = min(job.target, target)
        job.optional = job.optional and optional
        job.waiters.append(waiter)
        if deadline_s is not None:
            watch_deadline(self, job, waiter, deadline_s)
        waiter.future.add_done_callback(abandoner(self, job))
        self._pump()

    def load_into(self, key: AdapterKey, tier: Tier, *, optional: bool) -> Future[None]:
        future: Future[None] = Future()
        entry = self.cache.ledgers[tier].get(key)
        if entry is not None and entry.ready:
            future.set_result(None)
            return future
        self.cache.history.setdefault(key, AdapterHistory())
        waiter = Waiter(future, wants_lease=False, source=self.cache.source_tier(key, tier))
        self.attach(key, tier, waiter, optional=optional, deadline_s=None)
        return future

    def cancel(self, key: AdapterKey) -> bool:
        job = self.jobs.get(key)
        if job is None:
            return False
        error = LoadCancelledError(f"load of {key.ref} cancelled")
        waiters, job.waiters = job.waiters, []
        for waiter in waiters:
            settle(waiter.future, error=error)
        self.abort(job, error)
        return True

    def evict_entry(self, entry: ResidentEntry) -> None:
        self.cache.ledgers[entry.tier].remove(entry.key)
        self.pipeline.drop(entry.tier, entry.key, entry.slot)
        self.cache.stats.record_eviction(
            entry.tier, self.cache.history[entry.key], self.cache.clock.now()
        )

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
                for job in list(self.blocked):
                    if job in self.blocked:
                        self._place(job)
                again = self._retry_again
        finally:
            self._retrying = False

    # --- the state machine ---------------------------------------------------------------------

    def _pump(self) -> None:
        cfg = self.cache.config
        for job in list(self.queue):
            if sum(self.running.values()) >= cfg.max_concurrent_loads:
                return
            if self.running.get(job.key.tenant, 0) >= cfg.tenant_max_concurrent_loads:
                continue
            self.queue.remove(job)
            job.started = True
            self.running[job.key.tenant] = self.running.get(job.key.tenant, 0) + 1
            self._next_phase(job)

    def _next_phase(self, job: LoadJob) -> None:
        if job.cancel.cancelled:
            self._fail(job, LoadCancelledError(f"load of {job.key.ref} cancelled"))
            return
        resolved = self.footprints.get(job.key)
        if resolved is None:
            self._run(job, lambda: self.pipeline.resolve(job.key, job.cancel), self._on_resolved)
            return
        job.footprint = resolved.footprint
        move = self.cache.next_move(job.key, job.target)
        if move is None:
            self._finish(job)
            return
        try:
            size = resolved.footprint.bytes_in(move.target)
            self.cache.ledgers[move.target].check_admissible(job.key.tenant, size)
        except CapacityError as error:
            self._fail(job, error)
            return
        job.move = move
        if move.source is not Tier.L3:
            job.source_entry = self.cache.ledgers[move.source].entries[job.key]
            job.source_entry.refcount += 1
        self._run(job, lambda: self.pipeline.prepare(move, job.cancel), self._on_prepared)

    def _on_resolved(self, job: LoadJob, result: Resolved) -> None:
        self._record(job, result.seconds)
        self.footprints[job.key] = result
        self._next_phase(job)

    def _on_prepared(self, job: LoadJob, result: Prepared) -> None:
        job.prepared = result
        self._record(job, result.seconds)
        job.blocked_since_s = self.cache.clock.now()
        self._place(job)

    def _place(self, job: LoadJob) -> None:
        move, footprint, prepared = job.move, job.footprint, job.prepared
        if move is None or footprint is None or prepared is None or job.busy:
            return
        ledger = self.cache.ledgers[move.target]
        size = footprint.bytes_in(move.target)
        victims = ledger.plan_room(job.key.tenant, size, self.cache.ranked_victims(move.target))
        refused = (
            victims is not None
            and job.optional
            and victims
            and not self.cache.admits(move, footprint, victims)
        )
        if victims and not job.optional and any(w.wants_lease for w in job.waiters):
            wait_s = self.cache.deferral_s(move, footprint, victims, self._waited_s(job))
            if wait_s > 0:
                self._defer(job, wait_s)
                return
        if victims is None or refused:
            if job.optional:
                self._fail(
                    job,
                    CapacityError(
                        f"tier {move.target.name}: no room for optional load of {job.key.ref}"
                    ),
                )
            elif not any(w.wants_lease for w in job.waiters) and not ledger.fits_beside_pins(
                job.key.tenant, size
            ):
                # A pin has no deadline: waiting for an operator's unpin would hold the tenant's
                # load slot forever. Acquirers still wait, bounded by their deadlines.
                self._fail(
                    job,
                    CapacityError(
                        f"tier {move.target.name}: pinned adapters leave no room for "
                        f"{job.key.ref} (unpin one or raise the budget)"
                    ),
                )
            elif job not in self.blocked:
                self.blocked.append(job)
            return
        if job in self.blocked:
            self.blocked.remove(job)
        for victim in victims:
            self.evict_entry(victim)
        now = self.cache.clock.now()
        job.reserved = ledger.reserve(job.key, size, now)
        self._record(job, {Stage.RESERVE: self._waited_s(job)})
        slot = job.reserved.slot
        self._run(
            job, lambda: self.pipeline.install(move, prepared, slot, job.cancel), self._on_installed
        )

    def _defer(self, job: LoadJob, wait_s: float) -> None:
        """Blocks ``job`` for up to ``wait_s``: a release retries it sooner, a timer at the
        latest after DEFER_RECHECK_S (a copy too young to evict ages without an event)."""
        if job not in self.blocked:
            self.blocked.append(job)
        if job.defer_timer is None:
            at = self.cache.clock.now() + min(wait_s, DEFER_RECHECK_S)
            job.defer_timer = self.executor.call_at(at, lambda: self._retry_deferred(job))

    def _retry_deferred(self, job: LoadJob) -> None:
        """The timer of one deferred job: only that job looks again (a release retries all)."""
        with self.cache.lock:
            job.defer_timer = None
            if job in self.blocked:
                self._place(job)

    def _waited_s(self, job: LoadJob) -> float:
        """Seconds ``job`` has waited for room in its target tier."""
        since = job.blocked_since_s
        return 0.0 if since is None else self.cache.clock.now() - since

    def _on_installed(self, job: LoadJob, seconds: dict[Stage, float]) -> None:
        entry, move, prepared = job.reserved, job.move, job.prepared
        if entry is None or move is None or prepared is None:
            raise CacheIntegrityError("installs follow placements", job.key.ref)
        self._record(job, seconds)
        entry.ready = True
        entry.pinned = self.cache.pins.is_pinned(job.key, move.target)
        job.reserved = job.prepared = job.move = None
        self._release_source(job)
        self.cache.stats.record_load(
            move.target, self.cache.history[job.key], self.cache.clock.now()
        )
        move_s = sum(prepared.seconds.values()) + sum(seconds.values())
        if job.footprint is not None:
            self.cache.costs.measured(move, job.footprint.bytes_in(move.source), move_s)
        self._next_phase(job)

    def _finish(self, job: LoadJob) -> None:
        self._retire(job)
        hand_out(self, job)
        self._pump()
        self.retry_blocked()

    def _fail(self, job: LoadJob, error: BaseException) -> None:
        move = job.move
        self._undo_move(job)
        if move is not None and isinstance(error, _INTEGRITY_ERRORS):
            self._drop_corrupt_source(job.key, move.source)
        self._retire(job)
        self.cache.stats.load_failures += 1
        for waiter in job.waiters:
            settle(waiter.future, error=error)
        self._pump()
        self.retry_blocked()

    # --- helpers ---------------------------------------------------------------------------

    def _run(
        self, job: LoadJob, work: Callable[[], Any], then: Callable[[LoadJob, Any], None]
    ) -> None:
        job.busy = True

        def done(result: object) -> None:
            with self.cache.lock:
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

        self.executor.run(work, done)

    def abort(self, job: LoadJob, error: BaseException) -> None:
        """Nobody waits any more: cancel now, or when the running phase returns."""
        job.cancel.cancel()
        if not job.busy:
            self._fail(job, error)

    def _undo_move(self, job: LoadJob) -> None:
        if job.reserved is not None:
            entry = self.cache.ledgers[job.reserved.tier].remove(job.key)
            self.pipeline.drop(entry.tier, entry.key, entry.slot)
        if job.prepared is not None and job.move is not None:
            self.pipeline.discard(job.move, job.prepared)
        self._release_source(job)
        job.reserved = job.prepared = job.move = None

    def _drop_corrupt_source(self, key: AdapterKey, tier: Tier) -> None:
        """A copy that failed verification on its way up is never read again: the next load
        of ``key`` refetches from below (a pinned or leased copy stays until released)."""
        if tier is Tier.L3:
            return
        entry = self.cache.ledgers[tier].get(key)
        if entry is not None and entry.refcount == 0 and not entry.pinned:
            self.evict_entry(entry)

    def _release_source(self, job: LoadJob) -> None:
        if job.source_entry is not None:
            job.source_entry.refcount -= 1
            job.source_entry = None

    def _retire(self, job: LoadJob) -> None:
        if self.jobs.get(job.key) is job:
            del self.jobs[job.key]
        if job in self.queue:
            self.queue.remove(job)
        if job in self.blocked:
            self.blocked.remove(job)
        if job.started:
            job.started = False
            left = self.running[job.key.tenant] - 1
            if left:
                self.running[job.key.tenant] = left
            else:
                del self.running[job.key.tenant]

    def _record(self, job: LoadJob, seconds: dict[Stage, float]) -> None:
        job.add_seconds(seconds)
        for stage, value in seconds.items():
            self.cache.stats.record_stage(stage, value)
