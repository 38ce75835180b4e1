"""The step planner (torch-free): which tokens of which requests run in the next forward.

Each step, running sequences go first (decodes, then unfinished prefill chunks), then queued
requests are admitted while the sequence, token and KV-block budgets allow. The slot budget is
held by the adapter cache: a request is schedulable only once it holds a lease on its adapter's
slot, so a request whose adapter is loading (ADAPTER_WAIT) is skipped and never blocks others.

Fairness is by work, not by request count: every scheduled token charges its tenant's virtual
time (tokens / weight; the weight from ``SchedulerConfig.tenant_weights``, else the tenant's
priority class in the shared ``TenantBook``) and admission picks the backlogged tenant with the
least virtual time. A tenant that becomes active starts at the least virtual time of the active
tenants, so idling banks no credit; nor does waiting for adapter loads (a tenant that could not
run for a step catches up to the least virtual time of those that could). When KV blocks run
out, the most recently admitted sequence is preempted (its blocks freed, recomputed later; it
keeps its lease). While a higher priority class has requests, lower classes run and lease within
the seats it leaves (``tenancy.class_caps``).
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from itertools import islice

from loraplex.artifacts.identity import AdapterKey
from loraplex.clock import Clock
from loraplex.engine.blocks import BASE_NAMESPACE, BlockManager
from loraplex.engine.config import SchedulerConfig
from loraplex.engine.protocol import EngineRequest
from loraplex.engine.request import QUEUED_STATES, Request, RequestState
from loraplex.engine.step import ScheduledChunk, StepPlan
from loraplex.engine.tenancy import TenantBook, class_caps
from loraplex.errors import CapacityError, QueueFullError


def namespace_of(key: AdapterKey | None) -> str:
    """Prefix-reuse scope of a request: its adapter revision's full identity."""
    return BASE_NAMESPACE if key is None else str(key)


class Scheduler:
    """Queues, running set and budgets; mutated only by the engine thread."""

    def __init__(
        self,
        config: SchedulerConfig,
        blocks: BlockManager,
        clock: Clock,
        tenants: TenantBook | None = None,
    ) -> None:
        self.config = config
        self.tenants = tenants or TenantBook()  # live weights (the registry's priority classes)
        self.blocks = blocks
        self.clock = clock
        self.requests: dict[str, Request] = {}  # every live request by id
        self.running: list[Request] = []  # admission order (the tail is preempted first)
        self._queues: dict[str, deque[Request]] = {}  # per tenant: queued, arrival order
        self._vtime: dict[str, float] = {}  # per tenant: tokens charged / weight
        self._schedulable: set[str] = set()  # tenants with running or ready requests last step
        self._num_queued = 0

    # --- admission to the engine ------------------------------------------------------------

    def check_can_add(self, request: EngineRequest) -> None:
        """Raises QueueFullError / CapacityError when ``request`` cannot be queued now."""
        cfg = self.config
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is invalid; expected unique")
        if len(request.prompt_token_ids) >= cfg.max_model_len:
            raise CapacityError(
                f"prompt has {len(request.prompt_token_ids)} tokens; max_model_len is "
                f"{cfg.max_model_len}"
            )
        queue = self._queues.get(request.tenant)
        limit = cfg.tenant_max_queued
        if limit is not None and queue is not None and len(queue) >= limit:
            raise QueueFullError(f"tenant {request.tenant!r} queue", limit, cfg.retry_after_s)
        if self._num_queued >= cfg.max_queue_len and self.push_out_victim(request) is None:
            raise QueueFullError("the engine queue", cfg.max_queue_len, cfg.retry_after_s)

    def push_out_victim(self, request: EngineRequest) -> Request | None:
        """With the queue full, the request that makes room for ``request``: the newest queued
        one of the tenant holding the most queued requests, when that tenant holds more than
        ``request``'s tenant would with it (queue shares are max-min fair, so one flooding
        tenant can never push another into 429). None: the queue has room, or ``request``'s
        tenant already holds a fair share (it is the one refused)."""
        if self._num_queued < self.config.max_queue_len:
            return None
        held = {t: len(q) for t, q in self._queues.items()}  # _queues hold queued requests only
        heaviest = max(held, key=lambda t: (held[t], t), default=None)
        if heaviest is None or held[heaviest] <= held.get(request.tenant, 0) + 1:
            return None
        # Never one that has streamed tokens already (a preempted request, requeued at the head).
        return next((r for r in reversed(self._queues[heaviest]) if not r.output_token_ids), None)

    def add(self, request: EngineRequest) -> Request:
        """Queues ``request``; with the queue full the caller must first retire the
        ``push_out_victim`` (the scheduler itself never drops a queued request)."""
        self.check_can_add(request)
        cfg = self.config
        if self._num_queued >= cfg.max_queue_len:
            raise QueueFullError("the engine queue", cfg.max_queue_len, cfg.retry_after_s)
        now = self.clock.now()
        deadline = request.deadline_s or self.config.default_deadline_s
        req = Request(request, arrival_s=now, deadline_at_s=now + deadline)
        tenant = req.tenant
        if tenant not in self._queues:
            active = [self._vtime[t] for t in self._active_tenants()]
            floor = min(active, default=self._vtime.get(tenant, 0.0))
            self._vtime[tenant] = max(self._vtime.get(tenant, 0.0), floor)
            self._queues[tenant] = deque()
        self._queues[tenant].append(req)
        self.requests[req.request_id] = req
        self._num_queued += 1
        return req

    def finish(self, req: Request, state: RequestState, reason: str) -> None:
        """Retire a live request (FINISHED or ABORTED): frees its KV blocks. The caller
        releases its lease."""
        if req.state in QUEUED_STATES:
            self._queues[req.tenant].remove(req)
            self._num_queued -= 1
        elif req.state is RequestState.RUNNING:
            self.running.remove(req)
        self._free_kv(req)
        req.transition(state)
        req.finish_reason = reason
        del self.requests[req.request_id]
        if not self._queues[req.tenant] and all(r.tenant != req.tenant for r in self.running):
            del self._queues[req.tenant]

    # --- views for the engine ---------------------------------------------------------------

    @property
    def num_queued(self) -> int:
        return self._num_queued

    def queued_in_order(self, limit: int) -> list[Request]:
        """Up to ``limit`` queued requests in the order fair admission would take them
        (projected virtual times, each request charged its prompt + max_tokens)."""
        return list(islice(self._fair_order(), limit))

    def lease_candidates(
        self, may_request: Callable[[Request], bool] = lambda _: True
    ) -> list[Request]:
        """WAITING requests that need their adapter leased, from the lookahead window: queued
        requests in fair order until ``lease_lookahead`` distinct adapters are held, awaited or
        asked for (slots are per adapter: requests sharing one take one place). A request that
        may not ask now (``may_request`` refuses: its tenant is at its cold-load quota; or a
        capped lower-class tenant has no room left: slots follow seats) takes no place, and the
        rest of its tenant's queue is passed over this step: a tenant waiting on its own bound
        never keeps the others out."""
        room = self._lease_room()
        passed_over: set[str] = set()
        window: set[AdapterKey] = set()
        out: list[Request] = []
        for req in self._fair_order(passed_over):
            if len(window) >= self.config.lease_lookahead:
                break
            key = req.request.adapter_key
            if req.state is not RequestState.WAITING or req.adapter_ready:
                if key is not None:  # holds or awaits its lease (base-model requests need none)
                    window.add(key)
                continue
            left = room.get(req.tenant)
            if (left is not None and left <= 0) or not may_request(req):
                passed_over.add(req.tenant)
                continue
            if left is not None:
                room[req.tenant] = left - 1
            out.append(req)
            assert key is not None  # not adapter_ready: it has an adapter
            window.add(key)
        return out

    def prefetch_keys(self) -> list[AdapterKey]:
        """Adapters of the queued requests just past the lease window (prefetch to CPU)."""
        cfg = self.config
        order = self.queued_in_order(cfg.lease_lookahead + cfg.prefetch_lookahead)
        keys = (r.request.adapter_key for r in order[cfg.lease_lookahead :] if r.lease is None)
        return list(dict.fromkeys(k for k in keys if k is not None))

    def expired(self, now_s: float) -> list[Request]:
        """Queued requests past their deadline. Requests that already ran (even if preempted
        since) never expire: their stream has started."""
        return [
            r
            for q in self._queues.values()
            for r in q
            if r.deadline_at_s <= now_s and r.first_scheduled_s is None
        ]

    # --- planning ------------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        budget = self.config.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted: list[str] = []
        # Decodes before unfinished prefills, so a long prompt never delays running streams.
        order = sorted(self.running, key=lambda r: r.num_tokens - r.num_computed_tokens > 1)
        for req in order:
            if req.state is not RequestState.RUNNING or budget == 0:
                continue
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if not self._make_room(req, n, {c.request_id for c in chunks}, preempted):
                continue
            chunks.append(self._chunk(req, n))
            budget -= n
        ready = self._ready()
        self._catch_up(set(ready) | {r.tenant for r in self.running})
        for req in self._admissible(ready):
            if len(self.running) >= self.config.max_num_seqs or budget == 0:
                break
            n = self._admit(req, budget)
            if n == 0:
                break  # KV blocks exhausted: admit nothing more this step
            chunks.append(self._chunk(req, n))
            budget -= n
        return StepPlan(tuple(chunks), tuple(preempted))

    def update(self, plan: StepPlan, sampled: Mapping[str, int]) -> None:
        """Record a step's result: KV now holds the chunks' tokens; append sampled tokens."""
        for chunk in plan.chunks:
            req = self.requests.get(chunk.request_id)
            if req is None or req.state is not RequestState.RUNNING or req.seq_id != chunk.seq_id:
                continue  # aborted or preempted since the plan was made
            req.num_computed_tokens += len(chunk.token_ids)
            token = sampled.get(req.request_id)
            if token is not None:
                req.output_token_ids.append(token)
            self.blocks.record(chunk.seq_id, req.token_ids()[: req.num_computed_tokens])

    # --- internals -------------------------------------------------------------------------------

    def _weight(self, tenant: str) -> float:
        """The configured weight, else the tenant's priority-class weight (1.0 if unknown)."""
        weight = self.config.tenant_weights.get(tenant)
        return self.tenants.weight(tenant) if weight is None else weight

    def _fair_order(self, passed_over: set[str] | None = None) -> Iterator[Request]:
        """Queued requests in fair admission order; a tenant added to ``passed_over`` while
        iterating yields nothing more."""
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
                heapq.heappush(heap, (v + cost / self._weight(tenant), tenant, following))

    def _active_tenants(self) -> set[str]:
        return set(self._queues)

    def _ready(self) -> dict[str, deque[Request]]:
        """Per tenant with any: its queued requests that may run now, in arrival order."""
        ready = {
            t: deque(r for r in q if r.state is RequestState.WAITING and r.adapter_ready)
            for t, q in self._queues.items()
        }
        return {t: rs for t, rs in ready.items() if rs}

    def _admissible(self, ready: dict[str, deque[Request]]) -> Iterator[Request]:
        """``ready`` requests, each time from the backlogged tenant with the least virtual
        time (charges made while admitting count at once)."""
        running = Counter(r.tenant for r in self.running)
        caps = self._class_caps()
        while ready:
            tenant = min(ready, key=lambda t: (self._vtime[t], t))
            if running[tenant] >= caps.get(tenant, self.config.max_num_seqs):
                del ready[tenant]
                continue
            yield ready[tenant].popleft()
            running[tenant] += 1  # (a higher class admitted here was counted as queued)
            if not ready[tenant]:
                del ready[tenant]

    def _catch_up(self, schedulable: set[str]) -> None:
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

    def _class_caps(self) -> dict[str, int]:
        """Running-sequence caps of the tenants below the highest active priority class."""
        demand = Counter(r.tenant for r in self.running)
        for tenant, queue in self._queues.items():
            demand[tenant] += len(queue)
        weights = {t: self._weight(t) for t in self._active_tenants()}
        return class_caps(weights, demand, self.config.max_num_seqs, self.config.reserve_seqs)

    def _lease_room(self) -> dict[str, int]:
        """Capped tenants: how many more queued requests may hold or await a lease."""
        caps = self._class_caps()
        if not caps:
            return {}
        held = Counter(r.tenant for r in self.running)
        for queue in self._queues.values():
            for req in queue:
                if req.lease is not None or req.state is RequestState.ADAPTER_WAIT:
                    held[req.tenant] += 1
        return {tenant: cap - held[tenant] for tenant, cap in caps.items()}

    def _admit(self, req: Request, budget: int) -> int:
        """Move ``req`` to RUNNING with KV for its first chunk; returns that chunk's size (0 if
        the blocks do not fit, leaving ``req`` queued)."""
        seq_id = self.blocks.allocate(namespace_of(req.request.adapter_key))
        cached = self.blocks.match_prefix(seq_id, req.token_ids())
        n = min(req.num_tokens - cached, budget)
        if not self.blocks.can_grow(seq_id, cached + n):
            self.blocks.free(seq_id)
            return 0
        self.blocks.grow(seq_id, cached + n)
        self._queues[req.tenant].remove(req)
        self._num_queued -= 1
        req.transition(RequestState.RUNNING)
        req.seq_id, req.num_computed_tokens = seq_id, cached
        if req.first_scheduled_s is None:
            req.first_scheduled_s = self.clock.now()
        self.running.append(req)
        return n

    def _make_room(self, req: Request, n: int, scheduled: set[str], preempted: list[str]) -> bool:
        """Ensure ``req`` has blocks for ``n`` more tokens, preempting the most recently
        admitted sequence not yet ``scheduled`` this step; False when that was ``req``."""
        assert req.seq_id is not None  # RUNNING requests always hold a sequence
        while not self.blocks.can_grow(req.seq_id, req.num_computed_tokens + n):
            victim = next(r for r in reversed(self.running) if r.request_id not in scheduled)
            self._preempt(victim)
            preempted.append(victim.request_id)
            if victim is req:
                return False
        self.blocks.grow(req.seq_id, req.num_computed_tokens + n)
        return True

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self._free_kv(req)
        req.transition(RequestState.WAITING)
        self._queues[req.tenant].appendleft(req)
        self._num_queued += 1

    def _free_kv(self, req: Request) -> None:
        if req.seq_id is not None:
            self.blocks.free(req.seq_id)
        req.seq_id, req.num_computed_tokens = None, 0

    def _chunk(self, req: Request, n: int) -> ScheduledChunk:
        """The next ``n`` tokens of ``req``, charged to its tenant's virtual time."""
        assert req.seq_id is not None  # scheduled requests are RUNNING
        self._vtime[req.tenant] += n / self._weight(req.tenant)
        start = req.num_computed_tokens
        tokens = req.token_ids()[start : start + n]
        return ScheduledChunk(
            request_id=req.request_id,
            seq_id=req.seq_id,
            start_pos=start,
            token_ids=tuple(tokens),
            slot=req.slot,
            samples=start + n == req.num_tokens,
        )
