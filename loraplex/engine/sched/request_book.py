"""Where each live request is (torch-free): queued in its tenant's fair queue, running with a KV
sequence, or paused; the moves between those places. The base of ``scheduler.Scheduler``, which
plans steps over it (``planner``) and hands out adapter leases.

Invariants:
- A live request is in exactly one place: the fair queues (WAITING, ADAPTER_WAIT), ``running``
  (RUNNING, holding a KV sequence) or the paused set.
- A paused request (``pause``: its consumer stopped reading its output) is in neither the
  queues nor ``running``: it holds no seat and no lease (its adapter's slot is free for others;
  resumed, it asks for the lease again through the lease window), and is never scheduled until
  resumed or retired. Its KV sequence is kept while ``kept_kv`` allows (resumed, it decodes on
  with nothing recomputed; the planner frees kept sequences first when blocks run short), and
  freed as by a preemption otherwise (recomputed after ``resume``).
- Only a request kept across a pause (``kept_kv``: paused, or resumed and not yet admitted
  again) holds a KV sequence outside ``running`` (``check_integrity``).
- Retiring a request (``finish``) frees its KV blocks and releases its lease.
"""

from __future__ import annotations

import dataclasses
from itertools import islice

from loraplex.clock import Clock
from loraplex.engine.config import SchedulerConfig
from loraplex.engine.kv.blocks import BlockManager
from loraplex.engine.protocol import EngineRequest
from loraplex.engine.request import QUEUED_STATES, Request, RequestState
from loraplex.engine.sched.fair_order import FairQueues
from loraplex.engine.sched.kept_kv import KeptKv
from loraplex.engine.sched.kv_shares import KvShares
from loraplex.engine.sched.stats import PauseCounts, QueueView, queue_view
from loraplex.engine.tenant_shares import TenantBook
from loraplex.errors import PromptTooLongError, QueueFullError


class RequestBook:
    """The live requests and their places (queued, running, paused); mutated only by the engine
    thread, through ``Scheduler``."""

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
        # not running, holding their KV sequences (paused, or resumed and not yet admitted)
        self._kept = KeptKv(blocks, self._queues.tenants, config.max_paused_kv_fraction)
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
        self._kept.discard(req)
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
        up its seat, and its KV blocks too as a preempted sequence does (recomputed once
        resumed) unless ``kept_kv`` lets it keep them (nothing recomputed); queued, it leaves
        the queue. Either way its adapter lease is released: a request that
        does no work must not pin a GPU slot that other tenants' adapters need (one tenant's
        stuck streams on many adapters would hold them all). False, nothing changed: already
        paused, or waiting for its adapter (NOTE: a lease being loaded must find it in the
        queue; such a request has produced no output to fall behind on)."""
        if req.request_id in self._paused or req.state is RequestState.ADAPTER_WAIT:
            return False
        room = None
        if req.state is RequestState.RUNNING:
            room = self._kept.room_for(req, self.running, self._paused)
        if room is not None:
            for victim in room:  # other tenants' kept sequences, past their fair part
                self._free_kept(victim)
            self.running.remove(req)  # its seat only: its KV sequence stays as it is
            req.transition(RequestState.WAITING)
            self._kept.add(req)
            self._pause_counts.num_kept += 1
        elif req.state is RequestState.RUNNING:
            req.num_lost_tokens = req.num_computed_tokens  # its resume recomputes them
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

    def check_integrity(self) -> None:
        """Raises CacheIntegrityError if a request holds KV out of the running batch that is
        not kept, or the kept blocks pass their bound (``kept_kv``); then the blocks' own."""
        self._kept.check_integrity(self.requests.values())
        self.blocks.check_integrity()

    @property
    def pause_counts(self) -> PauseCounts:
        """Pauses, resumes and kept sequences so far (a copy)."""
        return dataclasses.replace(self._pause_counts)

    @property
    def num_kept_kv_blocks(self) -> int:
        """KV blocks held by requests out of the running batch (kept across a pause)."""
        return self._kept.num_blocks()

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

    # --- moves out of running ---------------------------------------------------------------------

    def _preempt(self, req: Request) -> None:
        self._unseat(req)
        self._queues.push_front(req)

    def _unseat(self, req: Request) -> None:
        """A running request gives up its seat and KV blocks (recomputed when it runs again)."""
        self.running.remove(req)
        self._free_kv(req)
        req.transition(RequestState.WAITING)

    def _drop_kept(self, tenant: str | None = None, spare: Request | None = None) -> bool:
        """Frees the first kept sequence (``KeptKv.victim``; of ``tenant`` only, if given;
        never ``spare``'s): recomputed when its request runs again. False: none to free."""
        victim = self._kept.victim(self._paused, tenant, spare)
        if victim is None:
            return False
        self._free_kept(victim)
        return True

    def _free_kept(self, victim: Request) -> None:
        """A kept sequence is freed before its request ran again: recomputed when it does."""
        self._kept.discard(victim)
        victim.num_lost_tokens = victim.num_computed_tokens
        self._free_kv(victim)
        self._pause_counts.num_kept_dropped += 1

    def _free_kv(self, req: Request) -> None:
        if req.seq_id is not None:
            self.blocks.free(req.seq_id)
        req.seq_id, req.num_computed_tokens = None, 0
