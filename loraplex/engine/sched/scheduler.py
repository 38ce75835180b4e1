"""The step planner (torch-free): which tokens of which requests run in the next forward.

Invariants:
- Only the ``Scheduler`` changes a request's state, its lease and its KV sequence.
- Each step, running sequences go first (decodes, then unfinished prefill chunks); then queued
  requests are admitted in fair order (``fair_order``) within the sequence, token and KV-block
  budgets, the class seat caps (``admission``) and each tenant's seat share (``seats``).
- A tenant owed a seat (``seats``: under its share with a request ready, and below its
  reservation or having done no more work than a tenant over its share) takes one within the
  step: with none free, the newest sequence of the tenant most over its share is preempted.
- A request is schedulable only while it holds its adapter's lease (or uses the base model):
  one whose adapter is loading (ADAPTER_WAIT) is skipped and never blocks the others.
- When KV blocks run out, the most recently admitted sequence of the tenant holding the most
  blocks per unit of weight is preempted (its blocks freed, recomputed later; it keeps its
  lease); a tenant at its ``max_kv_blocks`` preempts its own newest sequence to grow
  (``kv_shares``).
- A paused request (``pause``: its consumer stopped reading its output) is in neither the
  queues nor ``running``: it holds no seat, no KV block (freed as by a preemption, recomputed
  after ``resume``) and no lease (its adapter's slot is free for others; resumed, it asks for
  the lease again through the lease window), and is never scheduled until resumed or retired.
- A follower (``EngineRequest.prefix_leader``) is not admitted while its leader is live and has
  not computed its prompt; a request owed prompt logprobs reuses no cached prefix.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from itertools import islice

from loraplex.artifacts.identity import AdapterKey
from loraplex.clock import Clock
from loraplex.engine.config import SchedulerConfig
from loraplex.engine.kv.blocks import BlockManager, namespace_of
from loraplex.engine.protocol import EngineRequest
from loraplex.engine.request import QUEUED_STATES, HeldLease, Request, RequestState
from loraplex.engine.sched.admission import (
    AdapterLoads,
    ColdLoadQuota,
    admissible,
    hold_followers,
    lease_room,
    lease_window,
)
from loraplex.engine.sched.fair_order import FairQueues
from loraplex.engine.sched.kv_shares import KvShares
from loraplex.engine.sched.seats import (
    MIN_SEATS_FOR_HEADROOM,
    equal_shares,
    limit_caps,
    step_seats,
)
from loraplex.engine.sched.stats import PauseCounts, QueueView, queue_view
from loraplex.engine.sched.step_share import StepShares, chunk_work
from loraplex.engine.step import ScheduledChunk, StepPlan, StepResult
from loraplex.engine.tenant_shares import TenantBook
from loraplex.errors import CapacityError, PromptTooLongError, QueueFullError, QueueTimeoutError


class Scheduler:
    """Queues, running set, leases and budgets; mutated only by the engine thread."""

    def __init__(
        self,
        config: SchedulerConfig,
        blocks: BlockManager,
        clock: Clock,
        tenants: TenantBook | None = None,
    ) -> None:
        self.config = config
        self.blocks = blocks
        self.clock = clock
        self.requests: dict[str, Request] = {}  # every live request by id
        self.running: list[Request] = []  # admission order (the tail is preempted first)
        self._queues = FairQueues(tenants or TenantBook())
        self._kv = KvShares(blocks, self._queues.tenants)  # max_kv_blocks, KV victims
        self._paused: dict[str, Request] = {}  # out of scheduling until resumed (``pause``)
        self._pause_counts = PauseCounts()  # pauses and resumes so far (published)
        self._step = 0  # plans made so far (``step_share`` takes the longest-waiting first)
        self._last_run: dict[str, int] = {}  # request id -> the plan it last ran in

    # --- admission to the engine ------------------------------------------------------------

    def check_can_add(self, request: EngineRequest) -> None:
        """Raises PromptTooLongError (never fits) or QueueFullError (not now)."""
        cfg = self.config
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is invalid; expected unique")
        if len(request.prompt_token_ids) >= cfg.max_model_len:
            raise PromptTooLongError(
                f"prompt has {len(request.prompt_token_ids)} tokens; max_model_len is "
                f"{cfg.max_model_len}"
            )
        if self.num_queued >= cfg.max_queue_len and self.push_out_victim(request) is None:
            raise QueueFullError("the engine queue", cfg.max_queue_len, cfg.retry_hint_s)

    def push_out_victim(self, request: EngineRequest) -> Request | None:
        """With the queue full, the queued request that makes room for ``request``: the newest
        of the tenant holding the most, when it holds more than ``request``'s tenant would with
        it. None: the queue has room, or ``request``'s tenant already holds a fair share."""
        if self.num_queued < self.config.max_queue_len:
            return None
        return self._queues.push_out_victim(request.tenant)

    def add(self, request: EngineRequest) -> Request:
        """Queues ``request``; with the queue full the caller must first retire the
        ``push_out_victim`` (the scheduler itself never drops a queued request)."""
        self.check_can_add(request)
        cfg = self.config
        if self.num_queued >= cfg.max_queue_len:
            raise QueueFullError("the engine queue", cfg.max_queue_len, cfg.retry_hint_s)
        now = self.clock.now()
        deadline = request.deadline_s or cfg.default_deadline_s
        req = Request(request, arrival_s=now, deadline_at_s=now + deadline)
        self._queues.push(req)
        self.requests[req.request_id] = req
        return req

    def finish(self, req: Request, state: RequestState, reason: str) -> None:
        """Retire a live request (FINISHED or ABORTED): frees its KV blocks, releases its
        lease."""
        if self._paused.pop(req.request_id, None) is not None:
            pass  # neither queued nor running: nothing to take it out of
        elif req.state in QUEUED_STATES:
            self._queues.remove(req)
        elif req.state is RequestState.RUNNING:
            self.running.remove(req)
        self._free_kv(req)
        req.transition(state)
        req.finish_reason = reason
        if req.lease is not None:
            req.lease.release()
            req.lease = None
        del self.requests[req.request_id]
        self._last_run.pop(req.request_id, None)
        running = any(r.tenant == req.tenant for r in self.running)
        self._queues.forget_if_idle(req.tenant, running)

    def expired(self, now_s: float) -> list[Request]:
        """Queued requests past their deadline. Requests that already ran (even if preempted
        since) never expire: their stream has started."""
        return [
            r
            for q in self._queues.queued().values()
            for r in q
            if r.deadline_at_s <= now_s and r.first_scheduled_s is None
        ]

    # --- consumers that stopped reading --------------------------------------------------------

    def pause(self, req: Request) -> bool:
        """Takes ``req`` out of scheduling until ``resume``: its consumer has stopped reading its
        output, so every step it ran would only grow what waits undelivered. Running, it gives
        up its seat and KV blocks as a preempted sequence does (recomputed once resumed);
        queued, it leaves the queue. Either way its adapter lease is released: a request that
        does no work must not pin a GPU slot that other tenants' adapters need (one tenant's
        stuck streams on many adapters would hold them all). False, nothing changed: already
        paused, or waiting for its adapter (NOTE: a lease being loaded must find it in the
        queue; such a request has produced no output to fall behind on)."""
        if req.request_id in self._paused or req.state is RequestState.ADAPTER_WAIT:
            return False
        if req.state is RequestState.RUNNING:
            self._unseat(req)
        else:
            self._queues.remove(req)
        if req.lease is not None:
            req.lease.release()
            req.lease = None
        self._paused[req.request_id] = req
        self._pause_counts.num_pauses += 1
        return True

    def resume(self, request_id: str) -> bool:
        """Puts a paused request back at its tenant's head (its consumer reads again); False
        when ``request_id`` is not paused (never paused, resumed already, or retired). Without
        its lease it waits in the lease window like any queued request (the tenant's seat share,
        cold-load quota and the slots bound it again), given a fresh deadline for that wait:
        the time it spent paused was its client's, not the queue's."""
        req = self._paused.pop(request_id, None)
        if req is None:
            return False
        now = self.clock.now()
        req.deadline_at_s = now + (req.request.deadline_s or self.config.default_deadline_s)
        self._queues.push_front(req)
        self._pause_counts.num_resumes += 1
        return True

    def is_paused(self, request_id: str) -> bool:
        return request_id in self._paused

    @property
    def num_paused(self) -> int:
        return len(self._paused)

    # --- adapters: leases and loads ------------------------------------------------------------

    def lease_candidates(self, loads: AdapterLoads) -> list[Request]:
        """WAITING requests that should ask the cache for their adapter's lease now: the lease
        window in fair order, within the class seat caps, max_running_seqs and the cold-load
        quota."""
        room = lease_room(self._queues, self.running, self._seat_caps())
        quota = ColdLoadQuota(self._queues.tenants, self._awaited_keys(), loads)
        return lease_window(self._queues, self.config.lease_lookahead, room, quota)

    def prefetch_keys(self) -> list[AdapterKey]:
        """Adapters of the queued requests just past the lease window (prefetch to CPU)."""
        cfg = self.config
        if self.num_queued <= cfg.lease_lookahead:
            return []  # every queued request is in the lease window
        order = self.queued_in_order(cfg.lease_lookahead + cfg.prefetch_lookahead)
        keys = (r.request.adapter_key for r in order[cfg.lease_lookahead :] if r.lease is None)
        return list(dict.fromkeys(k for k in keys if k is not None))

    def admit_prefetches(self, keys: Iterable[AdapterKey], loads: AdapterLoads) -> list[AdapterKey]:
        """Those of ``keys`` whose prefetch may start now, within the cold-load quota."""
        quota = ColdLoadQuota(self._queues.tenants, self._awaited_keys(), loads)
        return [key for key in keys if quota.take(key)]

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

    def _awaited_keys(self) -> list[AdapterKey]:
        return [
            r.request.adapter_key
            for r in self.requests.values()
            if r.state is RequestState.ADAPTER_WAIT and r.request.adapter_key is not None
        ]

    # --- views ---------------------------------------------------------------------------------

    @property
    def num_queued(self) -> int:
        return self._queues.num_queued

    def queued_in_order(self, limit: int) -> list[Request]:
        """Up to ``limit`` queued requests in the order fair admission would take them."""
        return list(islice(self._queues.order(), limit))

    def make_stats(self) -> QueueView:
        return queue_view(
            self.requests.values(),
            len(self.running),
            self.blocks.usage,
            self._paused.keys(),
            self._pause_counts,
        )

    # --- planning ------------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        budget = self.config.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        waiting = self._step_waits(hold_followers(self._queues.ready(), self.requests))
        caps, preempted = self._plan_seats({self.requests[i].tenant for i in waiting})
        # Decodes before unfinished prefills, so a long prompt never delays running streams.
        order = sorted(self.running, key=lambda r: r.num_tokens - r.num_computed_tokens > 1)
        for req in order:
            if req.state is not RequestState.RUNNING or budget == 0:
                continue
            if req.request_id in waiting:
                continue  # its tenant's work in this step is at its share (``step_share``)
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if not self._make_room(req, n, {c.request_id for c in chunks}, preempted):
                continue
            chunks.append(self._chunk(req, n))
            budget -= n
        ready = hold_followers(self._queues.ready(), self.requests)
        self._queues.catch_up(set(ready) | {r.tenant for r in self.running})
        cfg = self.config
        for req in admissible(self._queues, ready, self.running, caps, cfg.max_num_seqs):
            if len(self.running) >= self.config.max_num_seqs or budget == 0:
                break
            if self._kv.over_cap(req, self.running):
                continue  # its tenant is at its max_kv_blocks: the others may still fit
            n = self._admit(req, budget)
            if n == 0:
                break  # KV blocks exhausted: admit nothing more this step
            chunks.append(self._chunk(req, n))
            budget -= n
        self._step += 1
        return StepPlan(tuple(chunks), tuple(preempted))

    def schedule_decodes(self) -> StepPlan | None:
        """``schedule()``'s plan in the steady state between arrivals and finishes, made without
        its seat and admission passes: no queued request is ready to run (none queued, or all
        waiting for their adapters), every running request decodes its one sampled token, the
        blocks for them are free and no tenant has a ``max_kv_blocks`` (so nobody is preempted
        or admitted: the seat caps would go unused). None, with nothing changed, in any other
        state (then ``schedule()`` plans)."""
        running = self.running
        if len(running) > self.config.max_num_batched_tokens:
            return None
        if self._queues.num_queued and self._queues.ready():
            return None
        blocks, needed, tenants = self.blocks, 0, self._kv.tenants
        for req in running:
            num_tokens = req.num_tokens
            if (
                req.state is not RequestState.RUNNING
                or num_tokens - req.num_computed_tokens != 1
                or _wants_prompt_logprobs(req)
                or tenants.get(req.tenant).max_kv_blocks is not None
            ):
                return None
            assert req.seq_id is not None  # RUNNING requests always hold a sequence
            needed += blocks.blocks_needed(req.seq_id, num_tokens)
        if not running or needed > blocks.num_free:
            return None
        if self._step_waits({}):
            return None  # some decodes wait out this step: ``schedule()`` plans it
        chunks = []
        for req in running:  # schedule()'s order: decodes first, stable
            assert req.seq_id is not None
            blocks.grow(req.seq_id, req.num_tokens)
            chunks.append(self._chunk(req, 1))
        self._queues.catch_up({r.tenant for r in running})
        self._step += 1
        return StepPlan(tuple(chunks), ())

    def advance_decodes(self, plan: StepPlan, token: int, num_steps: int) -> StepPlan | None:
        """``num_steps`` rounds of ``update(plan)`` (every chunk sampling ``token``) and then
        ``schedule_decodes()``, each round's plan the next round's, for a ``plan`` that
        ``schedule_decodes`` made last: the same state, without building the plans between
        (the simulator's steady decode runs). Returns the last round's plan, not applied. None,
        with nothing changed, where a round could plan otherwise: ``plan`` is not the running
        batch's decode step, a queued request is ready, or a tenant is over its equal share
        (the step-share rule may then hold some of its sequences back as contexts grow). The
        caller sizes ``num_steps`` so that no request ends and the KV blocks suffice
        (RuntimeError otherwise)."""
        running = self.running
        if (
            num_steps < 1
            or len(plan.chunks) != len(running)
            or not all(map(_is_decode_of, plan.chunks, running))
            or (self._queues.num_queued and self._queues.ready())
            or self._over_share({})
        ):
            return None
        for _ in range(num_steps - 1):
            self._apply_decodes(token)
            self._replan_decodes()
        self._apply_decodes(token)
        following = self.schedule_decodes()
        if following is None:
            raise RuntimeError("advance_decodes: a round is not a steady decode step")
        return following

    def _apply_decodes(self, token: int) -> None:
        """``update`` of the running batch's decode step, every sequence sampling ``token``."""
        blocks = self.blocks
        for req in self.running:
            assert req.seq_id is not None  # RUNNING requests always hold a sequence
            req.num_computed_tokens += 1
            req.output_token_ids.append(token)
            blocks.record(req.seq_id, req.token_ids()[: req.num_computed_tokens])

    def _replan_decodes(self) -> None:
        """``schedule_decodes``' effects, its plan not built: its checks hold in a decode run
        but the KV blocks', checked here. NOTE: its last-run steps and its ``catch_up`` are left
        out: the round's last plan, a real ``schedule_decodes``, sets every running request's
        last run, and ``catch_up`` with the tenants the previous plan had is a no-op."""
        blocks, running = self.blocks, self.running
        needed = 0
        for req in running:
            assert req.seq_id is not None
            needed += blocks.blocks_needed(req.seq_id, req.num_tokens)
        if needed > blocks.num_free:
            raise RuntimeError("advance_decodes: the KV blocks ran out in a decode run")
        for req in running:
            assert req.seq_id is not None
            blocks.grow(req.seq_id, req.num_tokens)
            self._queues.charge(req.tenant, 1)
        self._step += 1

    def update(self, plan: StepPlan, result: StepResult) -> None:
        """Record a step's result: KV now holds the chunks' tokens; append sampled tokens."""
        for chunk in plan.chunks:
            req = self.requests.get(chunk.request_id)
            if req is None or req.state is not RequestState.RUNNING or req.seq_id != chunk.seq_id:
                continue  # aborted or preempted since the plan was made
            req.num_computed_tokens += len(chunk.token_ids)
            token = result.sampled.get(req.request_id)
            if token is not None:
                req.output_token_ids.append(token)
            self.blocks.record(chunk.seq_id, req.token_ids()[: req.num_computed_tokens])

    # --- seats -----------------------------------------------------------------------------------

    def _seat_caps(self) -> dict[str, int]:
        cfg = self.config
        return limit_caps(self._queues, self.running, cfg.max_num_seqs, cfg.reserve_seqs)

    def _plan_seats(self, held_back: set[str]) -> tuple[dict[str, int], list[str]]:
        """This step's seat caps; preempts the sequences that give their seats up (``seats``)
        and returns their ids. ``held_back``: the tenant held to its share of this step's work
        (``step_share``), which gives seats up first."""
        cfg = self.config
        ready = hold_followers(self._queues.ready(), self.requests)
        caps, victims = step_seats(
            self._queues,
            self.running,
            ready,
            cfg.max_num_seqs,
            cfg.reserve_seqs,
            held_back=held_back,
        )
        for victim in victims:
            self._preempt(victim)
        return caps, [v.request_id for v in victims]

    def _step_waits(self, ready: Mapping[str, Iterable[Request]]) -> set[str]:
        """Running sequences that wait out this step: the busiest tenant's past its share of the
        step's work (``step_share``); none with ``step_work_ratio`` 0 (off), or in an engine
        of fewer than ``MIN_SEATS_FOR_HEADROOM`` seats, where an equal share is a seat or two and
        holding one more than it is no sign of a hog (as for the seat headroom, ``seats``)."""
        over = self._over_share(ready)
        if not over:
            return set()  # only a tenant over its equal share is held back (``StepShares``)
        ratio, budget = self.config.step_work_ratio, self.config.max_num_batched_tokens
        running = [r for r in self.running if r.state is RequestState.RUNNING]
        queued = Counter[str]()
        # A ready request counts whether or not a seat is free for it now: the tenant held back
        # gives seats up first (``seats.step_seats``), so it runs in this step all the same.
        for tenant, waiting in ready.items():
            first = next(iter(waiting), None)  # what the tenant may start this step at least
            if first is not None:
                queued[tenant] += chunk_work(min(first.num_tokens, budget))
        shares = StepShares(self._queues.weight, ratio, budget)
        return shares.waiting(running, queued, self._last_run, over)

    def _over_share(self, ready: Mapping[str, Iterable[Request]]) -> set[str]:
        """The tenants ``_step_waits`` may hold back: those running more sequences than their
        equal share, while two or more tenants have work (none while the rule is off)."""
        if not self.config.step_work_ratio or self.config.max_num_seqs < MIN_SEATS_FOR_HEADROOM:
            return set()
        held: dict[str, int] = {}
        for req in self.running:
            held[req.tenant] = held.get(req.tenant, 0) + 1
        if len(held.keys() | ready.keys()) < 2:
            return set()
        equal = equal_shares(self._queues, self.config.max_num_seqs)
        return {t for t, n in held.items() if n > equal.get(t, 0)}

    # --- internals -------------------------------------------------------------------------------

    def _admit(self, req: Request, budget: int) -> int:
        """Move ``req`` to RUNNING with KV for its first chunk; returns that chunk's size (0 if
        the blocks do not fit, leaving ``req`` queued)."""
        seq_id = self.blocks.allocate(namespace_of(req.request.tenant, req.request.adapter_key))
        # NOTE: prompt logprobs need logits at every prompt position: no cached prefix.
        cached = (
            0 if _wants_prompt_logprobs(req) else self.blocks.match_prefix(seq_id, req.token_ids())
        )
        n = min(req.num_tokens - cached, budget)
        if not self.blocks.can_grow(seq_id, cached + n):
            self.blocks.free(seq_id)
            return 0
        self.blocks.grow(seq_id, cached + n)
        self._queues.remove(req)
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
        while not self._may_grow(req, n):
            victim = self._kv.victim(req, n, self.running, scheduled)
            self._preempt(victim)
            preempted.append(victim.request_id)
            if victim is req:
                return False
        self.blocks.grow(req.seq_id, req.num_computed_tokens + n)
        return True

    def _may_grow(self, req: Request, n: int) -> bool:
        """Blocks are free for ``n`` more tokens of ``req``, within its tenant's max_kv_blocks."""
        assert req.seq_id is not None  # RUNNING requests always hold a sequence
        total = req.num_computed_tokens + n
        return self.blocks.can_grow(req.seq_id, total) and not self._kv.at_cap(req, n, self.running)

    def _preempt(self, req: Request) -> None:
        self._unseat(req)
        self._queues.push_front(req)

    def _unseat(self, req: Request) -> None:
        """A running request gives up its seat and KV blocks (recomputed when it runs again)."""
        self.running.remove(req)
        self._free_kv(req)
        req.transition(RequestState.WAITING)

    def _free_kv(self, req: Request) -> None:
        if req.seq_id is not None:
            self.blocks.free(req.seq_id)
        req.seq_id, req.num_computed_tokens = None, 0

    def _chunk(self, req: Request, n: int) -> ScheduledChunk:
        """The next ``n`` tokens of ``req``, charged to its tenant's virtual time."""
        assert req.seq_id is not None  # scheduled requests are RUNNING
        self._queues.charge(req.tenant, n)
        self._last_run[req.request_id] = self._step
        start = req.num_computed_tokens
        prompt = req.request.prompt_token_ids
        if start >= len(prompt):  # a decode: its tokens are all output (no full copy)
            tokens = req.output_token_ids[start - len(prompt) : start - len(prompt) + n]
        else:
            tokens = req.token_ids()[start : start + n]
        targets = None
        if _wants_prompt_logprobs(req):
            targets = req.request.prompt_token_ids[start + 1 : start + n + 1]
        return ScheduledChunk(
            request_id=req.request_id,
            seq_id=req.seq_id,
            start_pos=start,
            token_ids=tuple(tokens),
            slot=req.slot,
            samples=start + n == req.num_tokens,
            logprob_targets=targets,
        )


def _is_decode_of(chunk: ScheduledChunk, req: Request) -> bool:
    """``chunk`` is running ``req``'s one decode token, planned and not applied yet."""
    return (
        chunk.request_id == req.request_id
        and req.state is RequestState.RUNNING
        and chunk.seq_id == req.seq_id
        and chunk.start_pos == req.num_computed_tokens == req.num_tokens - 1
        and len(chunk.token_ids) == 1
        and not _wants_prompt_logprobs(req)
    )


def _wants_prompt_logprobs(req: Request) -> bool:
    """Its prompt's logprobs are still owed (they go out with the first token)."""
    return req.request.params.prompt_logprobs is not None and not req.output_token_ids
