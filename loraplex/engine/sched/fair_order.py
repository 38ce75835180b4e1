"""Per-tenant queues in fair order: fairness is by work, not by request count.

Every scheduled token charges its tenant's virtual time (tokens / weight, the weight of its
priority class in the shared ``TenantBook``); the backlogged tenant with the least virtual time
goes first. A tenant that becomes active starts at the least virtual time of the active tenants,
so idling banks no credit; nor does waiting for adapter loads (``catch_up``).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator, Mapping

from loraplex.engine.request import Request, RequestState
from loraplex.engine.tenant_shares import TenantBook


class FairQueues:
    """Queued requests per tenant (arrival order; preempted ones requeued at the head) and each
    tenant's virtual time. A tenant stays active (keeps its queue, maybe empty) while it has
    queued or running requests; the owner drops it with ``forget_if_idle``."""

    def __init__(self, tenants: TenantBook) -> None:
        self.tenants = tenants  # live weights (the registry's priority classes)
        self._queues: dict[str, deque[Request]] = {}  # active tenants' queued requests
        self._vtime: dict[str, float] = {}  # per tenant: tokens charged / weight
        self._schedulable: set[str] = set()  # tenants with running or ready requests last step
        self.num_queued = 0  # queued requests, all tenants
        self._activity = 0  # bumped whenever a tenant becomes active or idle
        # ``equal_shares``' last answer: (activity, settings, max_num_seqs, shares)
        self._equal: tuple[int, Mapping[str, object], int, dict[str, int]] | None = None

    def weight(self, tenant: str) -> float:
        return self.tenants.get(tenant).weight

    def active_tenants(self) -> set[str]:
        return set(self._queues)

    def equal_shares(self, max_num_seqs: int) -> Mapping[str, int]:
        """Each active tenant's equal share of ``max_num_seqs`` by weight, rounded down (read
        only). NOTE: remembered while the active tenants and the book's settings are the same
        (the planner asks several times per step); computed over ``active_tenants()`` in its
        order, as each time before."""
        settings = self.tenants.snapshot()
        memo = self._equal
        if memo is not None and memo[:3] == (self._activity, settings, max_num_seqs):
            return memo[3]
        weights = {t: self.weight(t) for t in self.active_tenants()}  # each read once
        total_weight = sum(weights.values())
        shares = {t: int(max_num_seqs * w / total_weight) for t, w in weights.items()}
        self._equal = (self._activity, settings, max_num_seqs, shares)
        return shares

    def queued(self) -> Mapping[str, deque[Request]]:
        """Per active tenant: its queued requests (read only)."""
        return self._queues

    def ready(self) -> dict[str, deque[Request]]:
        """Per tenant with any: its queued requests that may run now, in arrival order."""
        ready = {
            t: deque(r for r in q if r.state is RequestState.WAITING and r.adapter_ready)
            for t, q in self._queues.items()
        }
        return {t: rs for t, rs in ready.items() if rs}

    def push(self, req: Request) -> None:
        """Queue a new request at its tenant's tail (activating the tenant at the floor)."""
        tenant = req.tenant
        if tenant not in self._queues:
            active = [self._vtime[t] for t in self._queues]
            floor = min(active, default=self._vtime.get(tenant, 0.0))
            self._vtime[tenant] = max(self._vtime.get(tenant, 0.0), floor)
            self._queues[tenant] = deque()
            self._activity += 1
        self._queues[tenant].append(req)
        self.num_queued += 1

    def push_front(self, req: Request) -> None:
        """Requeue a preempted or resumed request at its tenant's head (a resumed request's
        tenant may have gone idle meanwhile: it is activated as ``push`` does)."""
        if req.tenant not in self._queues:
            self.push(req)
            return
        self._queues[req.tenant].appendleft(req)
        self.num_queued += 1

    def remove(self, req: Request) -> None:
        self._queues[req.tenant].remove(req)
        self.num_queued -= 1

    def forget_if_idle(self, tenant: str, running: bool) -> None:
        """Deactivate ``tenant`` once it has nothing queued or ``running`` (its virtual time is
        kept: returning later, it starts at the floor or where it was, whichever is later)."""
        if not self._queues.get(tenant) and not running and tenant in self._queues:
            del self._queues[tenant]  # NOTE: a paused request's tenant may be idle already
            self._activity += 1

    def charge(self, tenant: str, num_tokens: int) -> None:
        self._vtime[tenant] += num_tokens / self.tenants.get(tenant).weight

    def vtime(self, tenant: str) -> float:
        return self._vtime[tenant]

    def order(self, passed_over: set[str] | None = None) -> Iterator[Request]:
        """Queued requests in fair admission order (projected virtual times, each request
        charged its prompt + max_tokens); a tenant added to ``passed_over`` while iterating
        yields nothing more."""
        cursors = {t: iter(q) for t, q in self._queues.items() if q}
        heap = [(self._vtime[t], t, next(it)) for t, it in cursors.items()]
        heapq.heapify(heap)
        while heap:
            v, tenant, req = heapq.heappop(heap)
            if passed_over is not None and tenant in passed_over:
                continue
            yield req
            cost = len(req.request.prompt_token_ids) + req.request.params.max_tokens
            following = next(cursors[tenant], None)
            if following is not None:
                heapq.heappush(heap, (v + cost / self.weight(tenant), tenant, following))

    def catch_up(self, schedulable: set[str]) -> None:
        """A tenant that can run again after a step with nothing to run (all its requests were
        waiting for adapter loads) starts at the least virtual time of the tenants that could
        run all along: waiting for loads banks no credit, as idling does not (otherwise a tenant
        whose cold loads keep it waiting jumps ahead of everyone whenever a load finishes)."""
        returning = schedulable - self._schedulable
        steady = schedulable & self._schedulable
        if returning and steady:
            floor = min(self._vtime[t] for t in steady)
            for tenant in returning:
                self._vtime[tenant] = max(self._vtime[tenant], floor)
        self._schedulable = schedulable

    def push_out_victim(self, tenant: str) -> Request | None:
        """The newest queued request of the tenant holding the most queued requests, when that
        tenant holds more than ``tenant`` would with one more (queue shares are max-min fair,
        so one flooding tenant can never push another into 429); None otherwise."""
        held = {t: len(q) for t, q in self._queues.items()}
        heaviest = max(held, key=lambda t: (held[t], t), default=None)
        if heaviest is None or held[heaviest] <= held.get(tenant, 0) + 1:
            return None
        # Never one that has streamed tokens already (a preempted request, requeued at the head).
        return next((r for r in reversed(self._queues[heaviest]) if not r.output_token_ids), None)
