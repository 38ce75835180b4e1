"""One engine step, synchronously (the engine thread calls ``step`` in a loop).

Invariants:
- The core never changes a request's state, lease or KV: the scheduler does
  (``sched.scheduler``). The core carries its decisions to the adapter cache, the runner and
  the streams, and reports back (``on_lease`` / ``on_lease_failed`` / ``update``).
- A cold adapter costs its own requests a wait, never anyone else a step: a lease is asked for
  as a future, and a future that is not done at once is collected in a later step.
- A request is retired once (``_retire``): KV freed and lease released by the scheduler, an
  unfinished lease future kept as an orphan until it completes (then released), the stream
  closed (an ABORTED one with its error).
- ``view`` is replaced whole after every step and command (other threads read it lock-free).
- Automatic warm promotion/demotion (``cache.rebalance``) runs at most once per
  ``rebalance_interval_s`` of the clock; between runs it costs a clock read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace

from loraplex.artifacts.identity import AdapterKey
from loraplex.clock import Clock
from loraplex.engine.mode_control import ModeController
from loraplex.engine.modes import Transition
from loraplex.engine.output import OutputTracker
from loraplex.engine.protocol import FINISH_ABORT, EngineRequest, TokenDelta, TokenLogprob
from loraplex.engine.request import Request, RequestState
from loraplex.engine.runner import ModelRunner
from loraplex.engine.sched.admission import AdapterLoads
from loraplex.engine.sched.scheduler import Scheduler
from loraplex.engine.sched.stats import EMPTY_VIEW, QueueView
from loraplex.engine.step import StepPlan
from loraplex.engine.trace_log import EngineTrace, TraceLog
from loraplex.errors import (
    EngineUnavailableError,
    GenerationError,
    InvalidRequestError,
    NoAdapterCacheError,
    QueueFullError,
    QueueTimeoutError,
)
from loraplex.model.sampler import RowHistory
from loraplex.model.tokenizer import TextTokenizer
from loraplex.residency.cache import Lease, TieredAdapterCache
from loraplex.residency.ledger import Tier
from loraplex.sampling import SamplingParams

# Receives a request's deltas, or the error that ended it; called on the engine thread.
Sink = Callable[[TokenDelta | BaseException], None]

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
        self._sinks: dict[str, Sink] = {}
        self._outputs: dict[str, OutputTracker] = {}
        self._pending: dict[str, Future[Lease]] = {}  # ADAPTER_WAIT requests' lease futures
        self._orphans: list[Future[Lease]] = []  # abandoned lease futures, released when done
        self._prefetching: dict[AdapterKey, Future[None]] = {}  # prefetch window's loads
        self._traced: set[str] = set()  # live traced requests (``EngineRequest.traceparent``)
        self._lease_tiers: dict[str, Tier] = {}  # request id -> tier its lease was served from
        # request id -> prompt position -> its logprobs, until its first delta carries them
        self._prompt_logprobs: dict[str, dict[int, TokenLogprob]] = {}
        self._rebalance_interval_s = rebalance_interval_s  # None: no automatic warm policies
        self._rebalance_at_s = clock.now() + (rebalance_interval_s or 0.0)
        self.on_lease_done: Callable[[], None] = lambda: None  # wakes the engine thread
        self.modes: ModeController | None = None  # the ``mode`` setting (None: unmerged)
        self.view: QueueView = EMPTY_VIEW

    # --- commands (engine thread) --------------------------------------------------------------

    def add(self, request: EngineRequest, sink: Sink) -> None:
        if request.adapter_key is not None and self.cache is None:
            raise NoAdapterCacheError("this engine serves the base model only; no adapter cache")
        self._check_token_ids(request.params)
        self.scheduler.check_can_add(request)
        victim = self.scheduler.push_out_victim(request)
        if victim is not None:  # the queue is full: the heaviest tenant's newest request yields
            cfg = self.scheduler.config
            share = f"tenant {victim.tenant!r}'s share of the engine queue"
            error = QueueFullError(share, cfg.max_queue_len, cfg.retry_hint_s)
            self._retire(victim, RequestState.ABORTED, FINISH_ABORT, error)
        req = self.scheduler.add(request)
        if request.traceparent is not None:
            req.trace_log = TraceLog(req.arrival_s)
            self._traced.add(req.request_id)
        self._sinks[req.request_id] = sink
        if request.params.prompt_logprobs is not None:
            self._prompt_logprobs[req.request_id] = {}
        self._outputs[req.request_id] = OutputTracker(
            request.params,
            len(request.prompt_token_ids),
            self.tokenizer.eos_token_ids,
            self.tokenizer,
        )

    def abort(self, request_id: str, error: BaseException | None = None) -> None:
        req = self.scheduler.requests.get(request_id)
        if req is not None:
            self._retire(req, RequestState.ABORTED, FINISH_ABORT, error)

    def abort_all(self, error: BaseException) -> None:
        for req in list(self.scheduler.requests.values()):
            self._retire(req, RequestState.ABORTED, FINISH_ABORT, error)
        self.view = self.scheduler.make_stats()

    def close(self) -> None:
        """Abort everything and release every lease, including abandoned ones."""
        self.abort_all(EngineUnavailableError("the engine is shutting down"))
        for future in self._orphans:
            future.add_done_callback(_release_if_granted)
        self._orphans.clear()
        if self.modes is not None:  # the merged lease goes too; the base weights come back
            self.modes.close()

    # --- the step -------------------------------------------------------------------------------

    def step(self) -> bool:
        """One iteration; False when there was nothing to run (the loop may then sleep)."""
        self._rebalance()
        self._expire()
        self._collect_leases()
        self._request_leases()
        self._prefetch()
        if self.modes is not None:  # merge/unmerge happen between steps only
            self._trace_transitions(self.modes.before_step())
        plan = self.scheduler.schedule()
        worked = bool(plan.chunks)
        if worked:
            requests = self.scheduler.requests
            params = {
                c.request_id: requests[c.request_id].request.params
                for c in plan.chunks
                if c.samples or c.logprob_targets is not None
            }
            sampling = {c.request_id: params[c.request_id] for c in plan.chunks if c.samples}
            result = self.runner.run_isolated(
                plan, params, self._banned(sampling), self._histories(sampling)
            )
            for request_id, reason in result.failed.items():
                model_fault = request_id not in result.request_faults
                error = GenerationError(request_id, reason, model_fault=model_fault)
                self._retire(requests[request_id], RequestState.ABORTED, FINISH_ABORT, error)
            for request_id, part in result.prompt_logprobs.items():
                owed = self._prompt_logprobs.get(request_id)  # None: retired just above
                if owed is not None:  # by position: a preempted prefill's rerun overwrites
                    first = part.first_position
                    owed.update({first + i: entry for i, entry in enumerate(part.entries)})
            self._trace_batches(plan)
            self.scheduler.update(plan, result)
            if self.modes is not None:
                keys = {
                    c.request_id: requests[c.request_id].request.adapter_key for c in plan.chunks
                }
                self.modes.after_step(plan, keys)
            for request_id, token in result.sampled.items():
                self._emit(requests[request_id], token, result.logprobs.get(request_id))
        self.view = self.scheduler.make_stats()
        if self.modes is not None:  # the merged revision and transition times ride along
            self.view = self.modes.stamp(self.view)
        return worked

    def _trace_transitions(self, transitions: list[Transition]) -> None:
        """Notes each merge/unmerge in every live traced request's log (all of them waited)."""
        if not self._traced or not transitions:
            return
        now = self.clock.now()
        requests = self.scheduler.requests
        for request_id in self._traced:
            req = requests.get(request_id)
            log = None if req is None else req.trace_log
            if log is None:
                continue
            for t in transitions:
                log.mode_transition(now, t.seconds, t.kind.value, t.revision)

    def _trace_batches(self, plan: StepPlan) -> None:
        """Notes this step's batch shape in each traced request's log (a few compares per
        traced request; nothing for the others)."""
        if not self._traced:  # tracing off: one truth test per step
            return
        requests = self.scheduler.requests
        traced = [
            (c, log) for c in plan.chunks if (log := requests[c.request_id].trace_log) is not None
        ]
        if not traced:
            return
        now = self.clock.now()
        size = len(plan.chunks)
        num_revisions = len({c.slot for c in plan.chunks})
        strategy = self.runner.last_strategy
        for chunk, log in traced:
            if log.prefix_reused_tokens is None:  # its first chunk starts past the reused prefix
                log.prefix_reused_tokens = chunk.start_pos
            log.batch(now, size, num_revisions, strategy)

    def _check_token_ids(self, params: SamplingParams) -> None:
        """Token ids the sampler indexes must be in the model's vocabulary."""
        vocab = self.runner.vocab_size
        for name, ids in (
            ("logit_bias", [t for t, _ in params.logit_bias]),
            ("stop_token_ids", list(params.stop_token_ids)),
        ):
            if any(t >= vocab for t in ids):
                raise InvalidRequestError(
                    f"{name} token id {max(ids)} is invalid; expected < {vocab} (the vocabulary)",
                    name,
                )

    def _banned(self, params: dict[str, SamplingParams]) -> dict[str, frozenset[int]]:
        """Stop token ids, and EOS ids unless ignore_eos, per request still short of its
        ``min_tokens`` (as vLLM)."""
        eos = self.tokenizer.eos_token_ids
        return {
            rid: frozenset(p.stop_token_ids) | (frozenset() if p.ignore_eos else eos)
            for rid, p in params.items()
            if len(self._outputs[rid].token_ids) < p.min_tokens
        }

    def _histories(self, params: dict[str, SamplingParams]) -> dict[str, RowHistory]:
        """Token histories of the requests with a penalty (the others need none)."""
        requests = self.scheduler.requests
        return {
            rid: RowHistory(requests[rid].request.prompt_token_ids, requests[rid].output_token_ids)
            for rid, p in params.items()
            if p.penalized
        }

    def _emit(self, req: Request, token: int, logprob: TokenLogprob | None) -> None:
        at_limit = req.num_tokens >= self.scheduler.config.max_model_len
        delta = self._outputs[req.request_id].append(token, at_max_model_len=at_limit)
        if logprob is not None:
            delta = replace(delta, logprobs=(logprob,))
        if delta.completion_tokens == 1 and req.first_scheduled_s is not None:
            queued = max(0.0, req.first_scheduled_s - req.arrival_s)
            tier = self._lease_tiers.pop(req.request_id, None)
            delta = replace(delta, queue_s=queued, adapter_tier=tier)
        owed = self._prompt_logprobs.pop(req.request_id, None)
        if owed is not None:
            # NOTE: complete by the scheduler's invariant: a request owed prompt logprobs reuses
            # no cached prefix, so every prompt position ran before its first token was sampled.
            prompt = req.request.prompt_token_ids
            delta = replace(
                delta, prompt_logprobs=(None, *(owed[i] for i in range(1, len(prompt))))
            )
        if delta.finish_reason is not None and req.trace_log is not None:
            delta = replace(delta, trace=self._trace_of(req))
        self._send(req.request_id, delta)
        if delta.finish_reason is not None:
            self._retire(req, RequestState.FINISHED, delta.finish_reason, None)

    def _trace_of(self, req: Request) -> EngineTrace | None:
        log = req.trace_log
        if log is None:
            return None
        first = req.first_scheduled_s
        queued = None if first is None else max(0.0, first - req.arrival_s)
        return log.finish(self.clock.now(), queued, req.request.adapter_key is None)

    def _rebalance(self) -> None:
        interval = self._rebalance_interval_s
        if interval is None or self.cache is None or self.clock.now() < self._rebalance_at_s:
            return
        self._rebalance_at_s = self.clock.now() + interval
        try:
            changes = self.cache.rebalance()
        except Exception:  # warm placement is an optimisation: it must never fail requests
            _log.exception("automatic warm rebalance failed")
            return
        for key, warm in changes.items():
            _log.info("adapter %s: automatic warm policy now %s", key.ref, warm.value)

    def _expire(self) -> None:
        now = self.clock.now()
        for req in self.scheduler.expired(now):
            retry = self.scheduler.config.retry_hint_s
            error = QueueTimeoutError(req.request_id, now - req.arrival_s, retry)
            self._retire(req, RequestState.ABORTED, FINISH_ABORT, error)

    # --- adapter leases and prefetches ------------------------------------------------------

    def _collect_leases(self) -> None:
        for request_id, future in list(self._pending.items()):
            if future.done():
                del self._pending[request_id]
                self._settle(self.scheduler.requests[request_id], future)
        self._orphans = [f for f in self._orphans if not _release_if_granted(f)]

    def _request_leases(self) -> None:
        if self.cache is None:
            return
        for req in self.scheduler.lease_candidates(self._adapter_loads()):
            key = req.request.adapter_key
            assert key is not None  # lease candidates use an adapter
            remaining = max(req.deadline_at_s - self.clock.now(), 1e-3)
            future = self.cache.acquire_future(key, deadline_s=remaining)
            if future.done():
                self._settle(req, future)
            else:
                self.scheduler.wait_for_adapter(req)
                if req.trace_log is not None:
                    req.trace_log.defer(self.clock.now())
                self._pending[req.request_id] = future
                future.add_done_callback(lambda _: self.on_lease_done())

    def _settle(self, req: Request, future: Future[Lease]) -> None:
        error = future.exception()
        if error is not None:
            if req.trace_log is not None:
                req.trace_log.lease_failed(self.clock.now(), error)
            ending = self.scheduler.on_lease_failed(req, error)
            self._retire(req, RequestState.ABORTED, FINISH_ABORT, ending)
            return
        lease = future.result()
        self._lease_tiers[req.request_id] = lease.load.source
        if req.trace_log is not None:
            load = lease.load
            stages = {str(stage): s for stage, s in load.seconds.items()}
            req.trace_log.leased(self.clock.now(), load.source, stages, load.room_wait_s)
        self.scheduler.on_lease(req, lease)

    def _prefetch(self) -> None:
        if self.cache is None:
            return
        window = {k: self._prefetching.get(k) for k in self.scheduler.prefetch_keys()}
        fresh = [k for k, f in window.items() if f is None]
        for key in self.scheduler.admit_prefetches(fresh, self._adapter_loads()):
            window[key] = self.cache.prefetch(key, Tier.L1)
        self._prefetching = {k: f for k, f in window.items() if f is not None}

    def _adapter_loads(self) -> AdapterLoads:
        cache = self.cache
        assert cache is not None  # only asked for by an engine with an adapter cache
        in_flight = frozenset(k for k, f in self._prefetching.items() if not f.done())
        return AdapterLoads(lambda key: cache.is_resident(key, Tier.L0), in_flight)

    # --- retiring and streaming -------------------------------------------------------------

    def _retire(
        self, req: Request, state: RequestState, reason: str, error: BaseException | None
    ) -> None:
        """End a request: the scheduler frees its KV and releases its lease; an unfinished
        lease future becomes an orphan; its stream closes."""
        future = self._pending.pop(req.request_id, None)
        if future is not None:
            self._orphans.append(future)
        self.scheduler.finish(req, state, reason)
        self.runner.drop(req.request_id)
        self._lease_tiers.pop(req.request_id, None)
        self._traced.discard(req.request_id)
        self._prompt_logprobs.pop(req.request_id, None)
        tracker = self._outputs.pop(req.request_id)
        if state is RequestState.ABORTED:
            closing: TokenDelta | BaseException = error or TokenDelta(
                (),
                "",
                FINISH_ABORT,
                tracker.prompt_tokens,
                len(tracker.token_ids),
                trace=self._trace_of(req),
            )
            self._send(req.request_id, closing)
        self._sinks.pop(req.request_id, None)

    def _send(self, request_id: str, item: TokenDelta | BaseException) -> None:
        sink = self._sinks.get(request_id)
        if sink is None:
            return
        try:
            sink(item)
        except Exception:  # a sink whose event loop is gone: the client left
            _log.debug("dropping output of %s: its sink failed", request_id, exc_info=True)


def _release_if_granted(future: Future[Lease]) -> bool:
    """Release the lease of a finished, abandoned future; True once the future is done."""
    if not future.done():
        return False
    if not future.cancelled() and future.exception() is None:
        future.result().release()
    return True
