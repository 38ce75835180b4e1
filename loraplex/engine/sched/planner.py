"""Planning a step (torch-free): which tokens of which requests run in the next forward, and
recording what the forward did (``update``). The middle layer of ``scheduler.Scheduler``, over
the places ``request_book.RequestBook`` keeps.

Invariants:
- Each step, running sequences go first (decodes, then unfinished prefill chunks); then queued
  requests are admitted in fair order (``fair_order``) within the sequence, token and KV-block
  budgets, the class seat caps (``admission``) and each tenant's seat share (``seats``).
- A tenant owed a seat (``seats``: under its share with a request ready, and below its
  reservation or having done no more work than a tenant over its share) takes one within the
  step: with none free, the newest sequence of the tenant most over its share is preempted.
- A request is schedulable only while it holds its adapter's lease (or uses the base model):
  one whose adapter is loading (ADAPTER_WAIT) is skipped and never blocks the others.
- When KV blocks run out, the sequences kept across a pause (``kept_kv``) are freed first,
  and a tenant whose running sequences grew past its ``max_kv_blocks`` with kept ones beside
  them frees its kept ones; a resumed request that kept its sequence is admitted again on it,
  computing only what it had not (its last sampled token), and nothing is recomputed.
- When KV blocks run out and nothing is kept, the most recently admitted sequence of the
  tenant holding the most blocks per unit of weight is preempted (its blocks freed,
  recomputed later; it keeps its lease); a tenant at its ``max_kv_blocks`` preempts its own
  newest sequence to grow (``kv_shares``).
- A follower (``EngineRequest.prefix_leader``) is not admitted while its leader is live and has
  not computed its prompt; a request owed prompt logprobs reuses no cached prefix.
- ``schedule_decodes`` and ``advance_decodes`` plan exactly what ``schedule`` would, in the
  steady decode state only (None otherwise, nothing changed).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from loraplex.engine.kv.blocks import namespace_of
from loraplex.engine.request import Request, RequestState
from loraplex.engine.sched.admission import admissible, hold_followers
from loraplex.engine.sched.request_book import RequestBook
from loraplex.engine.sched.seats import step_seats
from loraplex.engine.sched.step_share import over_share, step_waits
from loraplex.engine.step import ScheduledChunk, StepPlan, StepResult


class StepPlanner(RequestBook):
    """Plans each step over the book's requests and applies its result; the KV blocks each
    chunk needs are taken here."""

    # --- planning ------------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        budget = self.config.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        while self._kept and (tenant := self._kept.over_cap(self.running)) is not None:
            self._drop_kept(tenant)
        first_ready = hold_followers(self._queues.ready(), self.requests)
        waiting = step_waits(self._queues, self.running, first_ready, self.config, self._last_run)
        caps, preempted = self._plan_seats(first_ready, {self.requests[i].tenant for i in waiting})
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

    # --- the steady decode state --------------------------------------------------------------

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
            # NOTE: ``num_tokens``, ``_wants_prompt_logprobs`` and ``tenant`` read inline: this
            # runs once per running sequence per step.
            request, output = req.request, req.output_token_ids
            num_tokens = len(request.prompt_token_ids) + len(output)
            if (
                req.state is not RequestState.RUNNING
                or num_tokens - req.num_computed_tokens != 1
                or (request.params.prompt_logprobs is not None and not output)
                or tenants.get(request.tenant).max_kv_blocks is not None
            ):
                return None
            assert req.seq_id is not None  # RUNNING requests always hold a sequence
            needed += blocks.blocks_needed(req.seq_id, num_tokens)
        if not running or needed > blocks.num_free:
            return None
        if step_waits(self._queues, running, {}, self.config, self._last_run):
            return None  # some decodes wait out this step: ``schedule()`` plans it
        chunks = []
        for req in running:  # schedule()'s order: decodes first, stable
            assert req.seq_id is not None
            blocks.grow(req.seq_id, req.num_tokens)
            chunks.append(self._chunk(req, 1))
        self._queues.catch_up({r.tenant for r in running})
        self._step += 1
        return StepPlan(tuple(chunks), ())

    def steady_as_contexts_grow(self) -> bool:
        """Whether a steady decode batch stays one while its contexts grow: no tenant is over its
        equal share. NOTE: one that is may be held back by the step-share rule a few steps on
        (a decode's work grows with its context), where ``schedule_decodes`` then declines."""
        return not over_share(self._queues, self.running, {}, self.config)

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
            or over_share(self._queues, running, {}, self.config)
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
            if blocks.fills(req.seq_id, req.num_computed_tokens):
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
            if self.blocks.fills(chunk.seq_id, req.num_computed_tokens):
                self.blocks.record(chunk.seq_id, req.token_ids()[: req.num_computed_tokens])

    # --- seats -----------------------------------------------------------------------------------

    def _plan_seats(
        self, ready: Mapping[str, deque[Request]], held_back: set[str]
    ) -> tuple[dict[str, int], list[str]]:
        """This step's seat caps; preempts the sequences that give their seats up (``seats``)
        and returns their ids. ``ready``: the queued requests that may run now (read only);
        ``held_back``: the tenant held to its share of this step's work (``step_share``), which
        gives seats up first."""
        cfg = self.config
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

    # --- internals -------------------------------------------------------------------------------

    def _admit(self, req: Request, budget: int) -> int:
        """Move ``req`` to RUNNING with KV for its first chunk; returns that chunk's size (0 if
        the blocks do not fit, leaving ``req`` queued). Kept sequences are freed to make room
        (``kept_kv``), never ``req``'s own: a request that kept its sequence across a pause
        runs on it."""
        if req.seq_id is not None:
            return self._readmit(req, budget)
        seq_id = self.blocks.allocate(namespace_of(req.request.tenant, req.request.adapter_key))
        # NOTE: prompt logprobs need logits at every prompt position: no cached prefix.
        cached = (
            0 if _wants_prompt_logprobs(req) else self.blocks.match_prefix(seq_id, req.token_ids())
        )
        n = min(req.num_tokens - cached, budget)
        while not self.blocks.can_grow(seq_id, cached + n):
            if not self._drop_kept():
                self.blocks.free(seq_id)
                return 0
        self.blocks.grow(seq_id, cached + n)
        req.seq_id, req.num_computed_tokens = seq_id, cached
        if req.num_lost_tokens:  # a resume whose KV a pause freed: computed again
            self._pause_counts.num_recomputed_tokens += max(0, req.num_lost_tokens - cached)
            req.num_lost_tokens = 0
        self._seat(req)
        return n

    def _readmit(self, req: Request, budget: int) -> int:
        """``_admit`` of a request holding its KV sequence (kept across a pause): only its
        tokens not yet computed run."""
        assert req.seq_id is not None
        n = min(req.num_tokens - req.num_computed_tokens, budget)
        while not self.blocks.can_grow(req.seq_id, req.num_computed_tokens + n):
            if not self._drop_kept(spare=req):
                return 0
        self.blocks.grow(req.seq_id, req.num_computed_tokens + n)
        self._kept.discard(req)
        self._seat(req)
        return n

    def _seat(self, req: Request) -> None:
        """A queued request holding KV for its first chunk joins the running batch."""
        self._queues.remove(req)
        req.transition(RequestState.RUNNING)
        if req.first_scheduled_s is None:
            req.first_scheduled_s = self.clock.now()
        self.running.append(req)

    def _make_room(self, req: Request, n: int, scheduled: set[str], preempted: list[str]) -> bool:
        """Ensure ``req`` has blocks for ``n`` more tokens, preempting the most recently
        admitted sequence not yet ``scheduled`` this step; False when that was ``req``."""
        assert req.seq_id is not None  # RUNNING requests always hold a sequence
        while not self._may_grow(req, n):
            total = req.num_computed_tokens + n
            if not self.blocks.can_grow(req.seq_id, total) and self._drop_kept():
                continue  # a kept sequence gave its blocks up: no running one need
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

    def _chunk(self, req: Request, n: int) -> ScheduledChunk:
        """The next ``n`` tokens of ``req``, charged to its tenant's virtual time."""
        assert req.seq_id is not None  # scheduled requests are RUNNING
        # NOTE: ``req``'s properties (request_id, tenant, slot, num_tokens) read inline: this
        # runs once per running sequence per step.
        request, output = req.request, req.output_token_ids
        self._queues.charge(request.tenant, n)
        self._last_run[request.request_id] = self._step
        start = req.num_computed_tokens
        prompt = request.prompt_token_ids
        if start >= len(prompt):  # a decode: its tokens are all output (no full copy)
            tokens = output[start - len(prompt) : start - len(prompt) + n]
        else:
            tokens = req.token_ids()[start : start + n]
        targets = None
        if request.params.prompt_logprobs is not None and not output:  # _wants_prompt_logprobs
            targets = prompt[start + 1 : start + n + 1]
        lease = req.lease
        return ScheduledChunk(
            request_id=request.request_id,
            seq_id=req.seq_id,
            start_pos=start,
            token_ids=tuple(tokens),
            slot=None if lease is None else lease.slot,
            samples=start + n == len(prompt) + len(output),
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
