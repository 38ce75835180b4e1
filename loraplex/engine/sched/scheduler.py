"""The step planner's entry point (torch-free): ``Scheduler``, and the adapter leases it hands out.

One object, three files by responsibility, each layer importing only the one below it:
``request_book.RequestBook`` (where each live request is: queued, running, paused),
``planner.StepPlanner`` (which tokens run in the next forward, and the step's result recorded)
and ``Scheduler`` here (which queued requests may ask the adapter cache for a lease, prefetch
and the lease's outcome). NOTE: layers of one class rather than separate objects: every step
reads the same queues, running list and blocks, and ``schedule`` runs on every engine step (the
simulator's hot path), so the state is not reached through another object.

Invariants (each layer's docstring has its own):
- Only the ``Scheduler`` changes a request's state, its lease and its KV sequence.
- A request is schedulable only while it holds its adapter's lease (or uses the base model):
  one whose adapter is loading (ADAPTER_WAIT) is skipped and never blocks the others.
- The lease window is taken in fair order, within the class seat caps, ``max_running_seqs``
  and each tenant's cold-load quota (``admission``); a capacity failure past the request's
  deadline is a queue timeout.
"""

from __future__ import annotations

from collections.abc import Mapping

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.request import HeldLease, Request, RequestState
from loraplex.engine.sched.admission import (
    AdapterLoads,
    ColdLoadQuota,
    lease_room,
    lease_window,
    load_charge,
)
from loraplex.engine.sched.planner import StepPlanner
from loraplex.engine.sched.seats import limit_caps
from loraplex.errors import CapacityError, QueueTimeoutError


class Scheduler(StepPlanner):
    """Queues, running set, leases and budgets; mutated only by the engine thread."""

    # --- adapters: leases and loads ------------------------------------------------------------

    def lease_candidates(self, loads: AdapterLoads) -> list[Request]:
        """WAITING requests that should ask the cache for their adapter's lease now: the lease
        window in fair order, within the class seat caps, max_running_seqs and the cold-load
        quota."""
        room = lease_room(self._queues, self.running, self._seat_caps())
        quota = ColdLoadQuota(self._queues.tenants, self._awaited(), loads)
        return lease_window(self._queues, self.config.lease_lookahead, room, quota)

    def prefetch_keys(self) -> dict[AdapterKey, str]:
        """Adapters of the queued requests just past the lease window (prefetch to CPU), in fair
        order, each with the tenant its load is charged to (``load_charge``: the owner when one
        of those requests is the owner's, else the first one's); the lease desk names it to
        the cache (``prefetch(requester=)``). NOTE: prefetched with no requester, a caller's
        queued calls of another tenant's public adapter were charged to the owner."""
        cfg = self.config
        if self.num_queued <= cfg.lease_lookahead:
            return {}  # every queued request is in the lease window
        order = self.queued_in_order(cfg.lease_lookahead + cfg.prefetch_lookahead)
        asking: dict[AdapterKey, list[str]] = {}
        for r in order[cfg.lease_lookahead :]:
            key = r.request.adapter_key
            if r.lease is None and key is not None:
                asking.setdefault(key, []).append(r.tenant)
        return {key: load_charge(key, who) for key, who in asking.items()}

    def admit_prefetches(
        self, window: Mapping[AdapterKey, str], loads: AdapterLoads
    ) -> list[AdapterKey]:
        """Those of ``window``'s adapters (each with the tenant charged) whose prefetch may
        start now, within that tenant's cold-load quota."""
        quota = ColdLoadQuota(self._queues.tenants, self._awaited(), loads)
        return [key for key, tenant in window.items() if quota.take(key, tenant)]

    def wait_for_adapter(self, req: Request) -> None:
        """``req`` asked for a lease that the cache is still loading."""
        req.transition(RequestState.ADAPTER_WAIT)

    def on_lease(self, req: Request, lease: HeldLease) -> None:
        """``req`` holds its adapter's lease: schedulable from now on."""
        req.lease = lease
        if req.state is RequestState.ADAPTER_WAIT:
            req.transition(RequestState.WAITING)

    def on_lease_failed(self, req: Request, error: BaseException) -> BaseException:
        """The error ``req`` ends with (the caller retires it): a capacity failure once its
        deadline has passed is a queue timeout."""
        now = self.clock.now()
        if isinstance(error, CapacityError) and now >= req.deadline_at_s:
            return QueueTimeoutError(req.request_id, now - req.arrival_s, self.config.retry_hint_s)
        return error

    def _awaited(self) -> list[tuple[AdapterKey, str]]:
        """The adapters of requests waiting for their lease, each with the request's tenant."""
        return [
            (r.request.adapter_key, r.tenant)
            for r in self.requests.values()
            if r.state is RequestState.ADAPTER_WAIT and r.request.adapter_key is not None
        ]

    def _seat_caps(self) -> dict[str, int]:
        cfg = self.config
        return limit_caps(self._queues, self.running, cfg.max_num_seqs, cfg.reserve_seqs)
