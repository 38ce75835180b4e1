"""One engine step, synchronously (the engine thread calls ``step`` in a loop).

``step`` reads: the lease desk's residency phases (``lease_desk``: warm rebalance, queue
deadlines, adapter leases, prefetches) → the scheduler's plan (``_plan``) →
``runner.run_isolated`` → ``scheduler.update`` and the streams → the published view.

Invariants:
- The core never changes a request's state, lease or KV: the scheduler does
  (``sched.scheduler``). The core carries its decisions to the adapter cache, the runner and
  the streams, and reports back (``on_lease`` / ``on_lease_failed`` / ``update``).
- A cold adapter costs its own requests a wait, never anyone else a step: a lease is asked for
  as a future, and a future that is not done at once is collected in a later step.
- The core keeps one record per live request (``live.Live``: stream, output tracker, lease
  future, what the first delta owes), one per request the scheduler holds
  (``check_integrity``). A request is retired once (``_retire``): its record removed, KV freed
  and lease released by the scheduler, an unfinished lease future kept as an orphan until it
  completes (then released), the stream closed (an ABORTED one with its error).
- ``view`` is replaced whole after every step and command (other threads read it lock-free).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from loraplex.clock import Clock
from loraplex.engine.lease_desk import LeaseDesk
from loraplex.engine.live import Live, Sink, check_records
from loraplex.engine.mode_control import ModeController
from loraplex.engine.output import OutputTracker
from loraplex.engine.protocol import FINISH_ABORT, EngineRequest, TokenDelta, TokenLogprob
from loraplex.engine.request import Request, RequestState
from loraplex.engine.runner import ModelRunner
from loraplex.engine.sched.scheduler import Scheduler
from loraplex.engine.sched.stats import EMPTY_VIEW, QueueView
from loraplex.engine.step import StepPlan, StepResult
from loraplex.engine.step_inputs import banned_ids, check_token_ids, histories
from loraplex.engine.step_trace import trace_batches, trace_of, trace_transitions
from loraplex.engine.trace_log import TraceLog
from loraplex.errors import (
    EngineUnavailableError,
    GenerationError,
    NoAdapterCacheError,
    QueueFullError,
)
from loraplex.model.tokenizer import TextTokenizer
from loraplex.residency.cache import TieredAdapterCache

_log = logging.getLogger(__name__)


class EngineCore:
    """Scheduler + runner + adapter cache, driven one step at a time by a single thread."""

    def __init__(
        self,
        scheduler: Scheduler,
        runner: ModelRunner,
        cache: TieredAdapterCache | None,
        tokenizer: TextTokenizer,
        clock: Clock,
        *,
        rebalance_interval_s: float | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.cache = cache
        self.tokenizer = tokenizer
        self.clock = clock
        self._live: dict[str, Live] = {}  # request id -> the core's record of it
        self._num_traced = 0  # live records whose request is traced (one test per step when 0)
        self.on_lease_done: Callable[[], None] = lambda: None  # wakes the engine thread
        self.leases = LeaseDesk(
            scheduler,
            cache,
            clock,
            lives=self._live,
            retire=lambda req, error: self._retire(req, RequestState.ABORTED, FINISH_ABORT, error),
            wake=self._wake,
            rebalance_interval_s=rebalance_interval_s,  # None: no automatic warm policies
        )
        self.modes: ModeController | None = None  # the ``mode`` setting (None: unmerged)
        self.view: QueueView = EMPTY_VIEW

    # --- commands (engine thread) --------------------------------------------------------------

    def add(self, request: EngineRequest, sink: Sink) -> None:
        if request.adapter_key is not None and self.cache is None:
            raise NoAdapterCacheError("this engine serves the base model only; no adapter cache")
        check_token_ids(request.params, self.runner.vocab_size)
        self.scheduler.check_can_add(request)
        victim = self.scheduler.push_out_victim(request)
        if victim is not None:  # the queue is full: the heaviest tenant's newest request yields
            cfg = self.scheduler.config
            share = f"tenant {victim.tenant!r}'s share of the engine queue"
            error = QueueFullError(share, cfg.max_queue_len, cfg.retry_hint_s)
            self._retire(victim, RequestState.ABORTED, FINISH_ABORT, error)
        params = request.params
        eos = self.tokenizer.eos_token_ids
        output = OutputTracker(params, len(request.prompt_token_ids), eos, self.tokenizer)
        req = self.scheduler.add(request)
        if request.traceparent is not None or request.stages:
            req.trace_log = TraceLog(req.arrival_s)
            self._num_traced += 1
        owed: dict[int, TokenLogprob] | None = None if params.prompt_logprobs is None else {}
        self._live[req.request_id] = Live(req, sink, output, prompt_logprobs=owed)

    def abort(self, request_id: str, error: BaseException | None = None) -> None:
        req = self.scheduler.requests.get(request_id)
        if req is not None:
            self._retire(req, RequestState.ABORTED, FINISH_ABORT, error)

    def pause(self, request_id: str) -> None:
        """Its consumer stopped reading: not scheduled until ``resume`` (``Scheduler.pause``:
        its lease released, so the tier its first delta reports is the next lease's; its KV
        kept while ``sched/kept_kv.py`` allows);
        unknown ids (retired meanwhile): no-op."""
        req = self.scheduler.requests.get(request_id)
        if req is not None and self.scheduler.pause(req):
            self._live[request_id].lease_tier = None
            self.view = self.scheduler.make_stats()

    def resume(self, request_id: str) -> None:
        """Its consumer reads again: queued at its tenant's head, to run on its kept KV or
        recompute as a preempted request; not paused: no-op."""
        if self.scheduler.resume(request_id):
            self.view = self.scheduler.make_stats()

    def abort_all(self, error: BaseException) -> None:
        for req in list(self.scheduler.requests.values()):
            self._retire(req, RequestState.ABORTED, FINISH_ABORT, error)
        self.view = self.scheduler.make_stats()

    def close(self) -> None:
        """Abort everything and release every lease, including abandoned ones."""
        self.abort_all(EngineUnavailableError("the engine is shutting down"))
        self.leases.close()
        if self.modes is not None:  # the merged lease goes too; the base weights come back
            self.modes.close()

    def _wake(self) -> None:
        self.on_lease_done()  # NOTE: read at each call: the engine thread sets it after __init__

    def check_integrity(self) -> None:
        """Raises ``live.LiveRecordError`` naming the first broken invariant: one record per
        live request, nothing kept for a retired one (engine thread, between steps)."""
        check_records(
            self._live, self.scheduler.requests, self._num_traced, self.runner.stream_ids()
        )

    # --- the step -------------------------------------------------------------------------------

    def step(self) -> bool:
        """One iteration; False when there was nothing to run (the loop may then sleep)."""
        self.leases.advance()
        if self.modes is not None:  # merge/unmerge happen between steps only
            transitions = self.modes.before_step()
            if self._num_traced:  # tracing off: one truth test per step
                trace_transitions(self._live.values(), transitions, self.clock)
        plan = self._plan()
        if plan.chunks:
            self._update(plan, self._run(plan))
        self.view = self.scheduler.make_stats()
        if self.modes is not None:  # the merged revision and transition times ride along
            self.view = self.modes.stamp(self.view)
        return bool(plan.chunks)

    def _plan(self) -> StepPlan:
        """The scheduler's plan for this step. With nothing queued, ``schedule_decodes`` plans
        the steady decode state (the same plan as ``schedule``, tests/engine/test_sched_decodes.py)
        without the seat and admission passes, about a third of a millisecond a step for 32
        sequences; any other state, or when it declines, ``schedule``."""
        scheduler = self.scheduler
        if not scheduler.num_queued:
            plan = scheduler.schedule_decodes()
            if plan is not None:
                return plan
        return scheduler.schedule()

    def _run(self, plan: StepPlan) -> StepResult:
        """The forward over ``plan``, with what sampling needs of each request."""
        lives = self._live
        params = {
            c.request_id: lives[c.request_id].req.request.params
            for c in plan.chunks
            if c.samples or c.logprob_targets is not None
        }
        sampling = {c.request_id: params[c.request_id] for c in plan.chunks if c.samples}
        banned = banned_ids(lives, sampling, self.tokenizer.eos_token_ids)
        return self.runner.run_isolated(plan, params, banned, histories(lives, sampling))

    def _update(self, plan: StepPlan, result: StepResult) -> None:
        """Carry a step's result: failed requests retired, the scheduler updated, tokens sent."""
        if self._num_traced:  # NOTE: before any retire below: every chunk ran
            trace_batches(self._live, plan, self.clock, self.runner.last_strategy)
        reqs = {c.request_id: self._live[c.request_id].req for c in plan.chunks}
        keys = {rid: req.request.adapter_key for rid, req in reqs.items()}
        for request_id, reason in result.failed.items():
            model_fault = request_id not in result.request_faults
            error = GenerationError(request_id, reason, model_fault=model_fault)
            self._retire(self._live[request_id].req, RequestState.ABORTED, FINISH_ABORT, error)
        for request_id, part in result.prompt_logprobs.items():
            live = self._live.get(request_id)  # None: retired just above
            owed = None if live is None else live.prompt_logprobs
            if owed is not None:  # by position: a preempted prefill's rerun overwrites
                first = part.first_position
                owed.update({first + i: entry for i, entry in enumerate(part.entries)})
        self.scheduler.update(plan, result)
        if self.modes is not None:
            tenants = {rid: req.tenant for rid, req in reqs.items()}
            probes = {rid for rid, req in reqs.items() if req.request.probe}
            self.modes.after_step(plan, keys, tenants, probes)
        for request_id, token in result.sampled.items():
            self._emit(self._live[request_id], token, result.logprobs.get(request_id))

    # --- streaming and retiring -------------------------------------------------------------

    def _emit(self, live: Live, token: int, logprob: TokenLogprob | None) -> None:
        req = live.req
        at_limit = req.num_tokens >= self.scheduler.config.max_model_len
        delta = live.output.append(token, at_max_model_len=at_limit)
        if logprob is not None:
            delta = replace(delta, logprobs=(logprob,))
        if delta.completion_tokens == 1 and req.first_scheduled_s is not None:
            queued = max(0.0, req.first_scheduled_s - req.arrival_s)
            delta = replace(delta, queue_s=queued, adapter_tier=live.lease_tier)
            live.lease_tier = None
        owed, live.prompt_logprobs = live.prompt_logprobs, None
        if owed is not None:
            # NOTE: complete by the scheduler's invariant: a request owed prompt logprobs reuses
            # no cached prefix, so every prompt position ran before its first token was sampled.
            prompt = req.request.prompt_token_ids
            delta = replace(
                delta, prompt_logprobs=(None, *(owed[i] for i in range(1, len(prompt))))
            )
        if delta.finish_reason is not None and req.trace_log is not None:
            delta = replace(delta, trace=trace_of(req, self.clock))
        _send(live, delta)
        if delta.finish_reason is not None:
            self._retire(req, RequestState.FINISHED, delta.finish_reason, None)

    def _retire(
        self, req: Request, state: RequestState, reason: str, error: BaseException | None
    ) -> None:
        """End a request: its record goes (one removal), the scheduler frees its KV and
        releases its lease, an unfinished lease future becomes an orphan, its stream closes."""
        live = self._live.pop(req.request_id)
        if live.lease_future is not None:
            self.leases.orphan(live.lease_future)
        if req.trace_log is not None:
            self._num_traced -= 1
        self.scheduler.finish(req, state, reason)
        self.runner.drop(req.request_id)
        if state is RequestState.ABORTED:
            output = live.output
            closing: TokenDelta | BaseException = error or TokenDelta(
                (),
                "",
                FINISH_ABORT,
                output.prompt_tokens,
                len(output.token_ids),
                trace=trace_of(req, self.clock),
            )
            _send(live, closing)


def _send(live: Live, item: TokenDelta | BaseException) -> None:
    try:
        live.sink(item)
    except Exception:  # a sink whose event loop is gone: the client left
        _log.debug("dropping output of %s: its sink failed", live.req.request_id, exc_info=True)
