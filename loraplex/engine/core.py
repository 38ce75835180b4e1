"""One engine step, synchronously (the engine thread calls ``step`` in a loop).

A step: time out queued requests past their deadline; collect finished adapter loads (their
requests go from ADAPTER_WAIT back to WAITING with a lease, or fail); ask the cache for leases
for the requests in the scheduler's lookahead window and prefetch the adapters just past it;
plan, run and sample; stream each request's delta to its sink. A cold adapter therefore costs
its own requests a wait, never anyone else a step.

A tenant's cold-load quota (``TenantSettings.max_cold_loads``) bounds the distinct adapters the
engine is loading for it at once (lease waits and prefetches together): a request whose adapter
would exceed it stays WAITING without a lease request and is retried next step, so a storm of
cold adapters from one tenant cannot take every load permit of the cache.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace

from loraplex.artifacts.identity import AdapterKey
from loraplex.clock import Clock
from loraplex.engine.output import OutputTracker
from loraplex.engine.protocol import FINISH_ABORT, EngineRequest, TokenDelta
from loraplex.engine.request import QUEUED_STATES, Request, RequestState
from loraplex.engine.runner import ModelRunner
from loraplex.engine.scheduler import Scheduler
from loraplex.engine.step import StepPlan, StepResult
from loraplex.engine.tenancy import TenantBook
from loraplex.errors import CapacityError, GenerationError, QueueFullError, QueueTimeoutError
from loraplex.model.tokenizer import TextTokenizer
from loraplex.residency.cache.jobs import Lease
from loraplex.residency.cache.tiered_cache import TieredAdapterCache
from loraplex.residency.ledger import Tier
from loraplex.sampling import SamplingParams

# Receives a request's deltas, or the error that ended it; called on the engine thread.
Sink = Callable[[TokenDelta | BaseException], None]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueueView:
    """The scheduler's counts, published by the engine thread after each step."""

    num_waiting: int  # queued and schedulable once admitted (base model or leased)
    num_adapter_wait: int  # queued behind an adapter load (or a lease not yet requested)
    num_running: int  # holding KV blocks
    kv_usage: float  # fraction of KV blocks in use
    queued_adapters: tuple[AdapterKey, ...]  # adapters of queued requests without a lease


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
        tenants: TenantBook | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.tenants = tenants or scheduler.tenants  # live cold-load quotas
        self.runner = runner
        self.cache = cache
        self.tokenizer = tokenizer
        self.clock = clock
        self._sinks: dict[str, Sink] = {}
        self._outputs: dict[str, OutputTracker] = {}
        self._pending: dict[str, Future[Lease]] = {}  # ADAPTER_WAIT requests' lease futures
        self._orphans: list[Future[Lease]] = []  # abandoned lease futures, released when done
        self._prefetching: dict[AdapterKey, Future[None]] = {}
        self._lease_tiers: dict[str, str] = {}  # request id -> tier its lease was served from
        self.on_lease_done: Callable[[], None] = lambda: None  # wakes the engine thread
        self.view = QueueView(0, 0, 0, 0.0, ())

    # --- commands (engine thread) --------------------------------------------------------------

    def add(self, request: EngineRequest, sink: Sink) -> None:
        if request.adapter_key is not None and self.cache is None:
            raise CapacityError("this engine serves the base model only; no adapter cache")
        self.scheduler.check_can_add(request)
        victim = self.scheduler.push_out_victim(request)
        if victim is not None:  # the queue is full: the heaviest tenant's newest request yields
            cfg = self.scheduler.config
            error = QueueFullError(
                f"tenant {victim.tenant!r}'s share of the engine queue", cfg.max_queue_len,
                cfg.retry_after_s,
            )  # fmt: skip
            self._retire(victim, RequestState.ABORTED, FINISH_ABORT, error)
        req = self.scheduler.add(request)
        self._sinks[req.request_id] = sink
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
        self._publish()

    def close(self) -> None:
        """Abort everything and release every lease, including abandoned ones."""
        self.abort_all(CapacityError("the engine is shutting down"))
        for future in self._orphans:
            future.add_done_callback(_release_if_granted)
        self._orphans.clear()

    # --- the step -------------------------------------------------------------------------------

    def step(self) -> bool:
        """One iteration; False when there was nothing to run (the loop may then sleep)."""
        self._expire()
        self._collect_leases()
        self._request_leases()
        self._prefetch()
        plan = self.scheduler.schedule()
        worked = bool(plan.chunks)
        if worked:
            params = {c.request_id: self.scheduler.requests[c.request_id].request.params
                      for c in plan.chunks if c.samples}  # fmt: skip
            result = self._run(plan, params, self._banned(params))
            for request_id, reason in result.failed.items():
                req = self.scheduler.requests[request_id]
                error = GenerationError(request_id, reason)
                self._retire(req, RequestState.ABORTED, FINISH_ABORT, error)
            self.scheduler.update(plan, result.sampled)
            for request_id, token in result.sampled.items():
                self._emit(self.scheduler.requests[request_id], token)
        self._publish()
        return worked

    def _run(
        self,
        plan: StepPlan,
        params: dict[str, SamplingParams],
        banned: dict[str, frozenset[int]],
    ) -> StepResult:
        """Runs ``plan``; if the forward raises, runs each chunk alone so that only the
        request whose part raises fails (with its own error), and the others still advance.
        Rerunning is safe: a chunk writes the same keys/values to the same KV rows again."""
        try:
            return self.runner.run(plan, params, banned)
        except Exception:
            _log.exception("engine step of %d chunks failed; isolating", len(plan.chunks))
        sampled: dict[str, int] = {}
        failed: dict[str, str] = {}
        for chunk in plan.chunks:
            rid = chunk.request_id
            mine = {rid: params[rid]} if rid in params else {}
            try:
                result = self.runner.run(StepPlan((chunk,), ()), mine, banned)
            except Exception as exc:
                _log.warning("request %s fails alone: %r", chunk.request_id, exc)
                failed[chunk.request_id] = f"its part of the step raised {type(exc).__name__}"
                continue
            sampled.update(result.sampled)
            failed.update(result.failed)
        return StepResult(sampled, failed)

    def _banned(self, params: dict[str, SamplingParams]) -> dict[str, frozenset[int]]:
        """EOS ids per request still short of its ``min_tokens`` (as vLLM: unless ignore_eos)."""
        eos = self.tokenizer.eos_token_ids
        return {
            rid: eos
            for rid, p in params.items()
            if not p.ignore_eos and len(self._outputs[rid].token_ids) < p.min_tokens
        }

    def _emit(self, req: Request, token: int) -> None:
        at_limit = req.num_tokens >= self.scheduler.config.max_model_len
        delta = self._outputs[req.request_id].append(token, at_max_model_len=at_limit)
        if delta.completion_tokens == 1 and req.first_scheduled_s is not None:
            queued = max(0.0, req.first_scheduled_s - req.arrival_s)
            tier = self._lease_tiers.pop(req.request_id, None)
            delta = replace(delta, queue_s=queued, adapter_tier=tier)
        self._send(req.request_id, delta)
        if delta.finish_reason is not None:
            self._retire(req, RequestState.FINISHED, delta.finish_reason, None)

    def _expire(self) -> None:
        now = self.clock.now()
        for req in self.scheduler.expired(now):
            retry = self.scheduler.config.retry_after_s
            error = QueueTimeoutError(req.request_id, now - req.arrival_s, retry)
            self._retire(req, RequestState.ABORTED, FINISH_ABORT, error)

    def _collect_leases(self) -> None:
        for request_id, future in list(self._pending.items()):
            if not future.done():
                continue
            del self._pending[request_id]
            req = self.scheduler.requests[request_id]
            self._take_lease(req, future)
        self._orphans = [f for f in self._orphans if not _release_if_granted(f)]

    def _request_leases(self) -> None:
        if self.cache is None:
            return
        cache = self.cache
        loading = self._loads_by_tenant()

        def may_request(req: Request) -> bool:  # within the tenant's cold-load quota
            key = req.request.adapter_key
            assert key is not None  # lease candidates use an adapter
            if not self._may_load(key, loading):
                return False
            if not cache.is_resident(key, Tier.L0):
                loading.setdefault(key.tenant, set()).add(key)
            return True

        for req in self.scheduler.lease_candidates(may_request):
            key = req.request.adapter_key
            assert key is not None
            remaining = max(req.deadline_at_s - self.clock.now(), 1e-3)
            future = cache.acquire_future(key, deadline_s=remaining)
            if future.done():
                self._take_lease(req, future)
            else:
                req.transition(RequestState.ADAPTER_WAIT)
                self._pending[req.request_id] = future
                future.add_done_callback(lambda _: self.on_lease_done())

    def _loads_by_tenant(self) -> dict[str, set[AdapterKey]]:
        """Adapters each tenant is waiting on now: unfinished lease waits and prefetches."""
        loading: dict[str, set[AdapterKey]] = {}
        waits = [self.scheduler.requests[rid].request.adapter_key
                 for rid, f in self._pending.items() if not f.done()]  # fmt: skip
        fetches = [k for k, f in self._prefetching.items() if not f.done()]
        for key in (*waits, *fetches):
            if key is not None:
                loading.setdefault(key.tenant, set()).add(key)
        return loading

    def _may_load(self, key: AdapterKey, loading: dict[str, set[AdapterKey]]) -> bool:
        """Whether asking for ``key`` keeps its tenant within its cold-load quota (joining a
        load already in flight, or a hit, costs nothing)."""
        limit = self.tenants.max_cold_loads(key.tenant)
        keys = loading.get(key.tenant, set())
        if limit is None or key in keys or len(keys) < limit:
            return True
        return self.cache is not None and self.cache.is_resident(key, Tier.L0)

    def _take_lease(self, req: Request, future: Future[Lease]) -> None:
        error = future.exception()
        if error is not None:
            if isinstance(error, CapacityError) and self.clock.now() >= req.deadline_at_s:
                retry = self.scheduler.config.retry_after_s
                error = QueueTimeoutError(req.request_id, self.clock.now() - req.arrival_s, retry)
            self._retire(req, RequestState.ABORTED, FINISH_ABORT, error)
            return
        lease = future.result()
        req.lease = lease
        self._lease_tiers[req.request_id] = lease.load.source.name
        if req.state is RequestState.ADAPTER_WAIT:
            req.transition(RequestState.WAITING)

    def _prefetch(self) -> None:
        if self.cache is None:
            return
        keys = self.scheduler.prefetch_keys()
        window = {k: self._prefetching.get(k) for k in keys}
        loading = self._loads_by_tenant()
        for key, future in window.items():
            if future is None and self._may_load(key, loading):
                window[key] = self.cache.prefetch(key, Tier.L1)
                loading.setdefault(key.tenant, set()).add(key)
        self._prefetching = {k: f for k, f in window.items() if f is not None}

    def _retire(
        self, req: Request, state: RequestState, reason: str, error: BaseException | None
    ) -> None:
        """End a request: free KV, release or abandon its lease, close its stream."""
        future = self._pending.pop(req.request_id, None)
        if future is not None:
            self._orphans.append(future)
        self.scheduler.finish(req, state, reason)
        if req.lease is not None:
            req.lease.release()
            req.lease = None
        self.runner.drop(req.request_id)
        self._lease_tiers.pop(req.request_id, None)
        tracker = self._outputs.pop(req.request_id)
        if state is RequestState.ABORTED:
            closing: TokenDelta | BaseException = error or TokenDelta(
                (), "", FINISH_ABORT, tracker.prompt_tokens, len(tracker.token_ids)
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

    def _publish(self) -> None:
        queued = [r for r in self.scheduler.requests.values() if r.state in QUEUED_STATES]
        waiting = sum(r.adapter_ready for r in queued)
        keys = (r.request.adapter_key for r in queued if not r.adapter_ready)
        self.view = QueueView(
            num_waiting=waiting,
            num_adapter_wait=len(queued) - waiting,
            num_running=len(self.scheduler.running),
            kv_usage=self.scheduler.blocks.usage,
            queued_adapters=tuple(dict.fromkeys(k for k in keys if k is not None)),
        )


def _release_if_granted(future: Future[Lease]) -> bool:
    """Release the lease of a finished, abandoned future; True once the future is done."""
    if not future.done():
        return False
    if not future.cancelled() and future.exception() is None:
        future.result().release()
    return True
