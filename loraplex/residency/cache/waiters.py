"""The waiter side of a load: handing out leases, typed failures, deadlines and abandonment.

Torch-free; every function runs under the cache's lock (callbacks retake it). A waiter's future
is settled exactly once: ``settle`` reports False when the future was already cancelled or
completed, so a lease granted to a waiter that just gave up is handed straight back.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import TYPE_CHECKING, Any

from loraplex.errors import CapacityError, LoadCancelledError
from loraplex.residency.cache.jobs import LoadJob, Waiter
from loraplex.residency.ledger import Tier
from loraplex.residency.pipeline import LoadResult

if TYPE_CHECKING:
    from loraplex.residency.cache.load_flow import LoadFlow


def settle(
    future: Future[Any], *, result: object = None, error: BaseException | None = None
) -> bool:
    """Completes a waiter's future; False when it was already cancelled or completed."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        return False
    return True


def hand_out(flow: LoadFlow, job: LoadJob) -> None:
    """Settles every waiter of a finished job: a lease for acquirers, None for prefetchers."""
    entry = flow.cache.ledgers[Tier.L0].get(job.key)
    for waiter in job.waiters:
        if waiter.wants_lease and entry is not None and entry.ready:
            load = LoadResult(job.key, waiter.source, dict(job.seconds))
            if not settle(waiter.future, result=flow.cache.grant(entry, load)):
                entry.refcount -= 1
        elif waiter.wants_lease:
            settle(waiter.future, error=CapacityError(f"{job.key.ref} left L0 before its lease"))
        else:
            settle(waiter.future, result=None)


def watch_deadline(flow: LoadFlow, job: LoadJob, waiter: Waiter, deadline_s: float) -> None:
    """Fails ``waiter`` at ``deadline_s`` unless settled first (then the timer is cancelled, so
    a real executor keeps no sleeping timer per finished acquire)."""
    timer = flow.executor.call_at(deadline_s, lambda: expire(flow, job, waiter))
    waiter.future.add_done_callback(lambda _: timer.cancel())


def expire(flow: LoadFlow, job: LoadJob, waiter: Waiter) -> None:
    with flow.cache.lock:
        if waiter.future.done() or waiter not in job.waiters:
            return
        job.waiters.remove(waiter)
        state = "waiting for room" if job in flow.blocked else "loading"
        error = CapacityError(
            f"adapter {job.key.ref}: deadline passed while {state} (tier budgets full of "
            "pinned or in-use adapters, or loads queued)"
        )
        settle(waiter.future, error=error)
        if not job.waiters and flow.jobs.get(job.key) is job:
            flow.abort(job, LoadCancelledError(f"load of {job.key.ref} cancelled: no waiters"))


def abandoner(flow: LoadFlow, job: LoadJob) -> Callable[[Future[Any]], None]:
    """A done-callback that abandons the waiter of ``job`` whose future was cancelled."""

    def abandon(future: Future[Any]) -> None:
        if not future.cancelled():
            return
        with flow.cache.lock:
            if flow.jobs.get(job.key) is not job:
                return  # that load already ended; a later one for the key is not ours
            job.waiters = [w for w in job.waiters if w.future is not future]
            if not job.waiters:
                flow.abort(job, LoadCancelledError(f"load of {job.key.ref} abandoned"))

    return abandon
