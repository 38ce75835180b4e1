"""One simulated engine replica: the real scheduler and adapter cache, stepped on the virtual
clock, with the runner replaced by the cost model's step time.

The glue mirrors ``engine.core.EngineCore.step`` (expire, collect leases, ask for leases in the
scheduler's lease window, prefetch, schedule, update): every decision is the scheduler's or the
cache's own; this class only carries them and charges time. A step is one event: planned at
``t``, its result applied at ``t + step_s`` (no request can join a step already running), then
the next step is planned at once. An idle replica plans again when a request arrives; one whose
requests all wait (for adapter loads, a load quota) plans again when a lease it waits for
completes, or after ``idle_wait_s`` (the engine loop's sleep when nothing can run), so queue
deadlines expire on time. A steady decode batch runs its identical steps as one event
(``sim/decode_run.py``), caught up whenever something touches the replica first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from concurrent.futures import Future
from functools import partial
from typing import NamedTuple

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.config import SchedulerConfig
from loraplex.engine.kv.blocks import BlockManager
from loraplex.engine.protocol import EngineRequest
from loraplex.engine.request import Request, RequestState
from loraplex.engine.sched.admission import AdapterLoads
from loraplex.engine.sched.scheduler import Scheduler
from loraplex.engine.step import StepPlan, StepResult
from loraplex.engine.tenant_shares import TenantBook, TenantSettings
from loraplex.errors import LoraplexError, QueueFullError, QueueTimeoutError
from loraplex.residency.cache import CacheConfig, Lease, SimExecutor, TieredAdapterCache
from loraplex.residency.cache.executors import SimTimer
from loraplex.residency.ledger import Tier, TierBudget
from loraplex.residency.pipeline import Footprint
from loraplex.residency.policy import make_policy
from loraplex.residency.warm import AutoWarmConfig
from loraplex.sampling import FINISH_ABORT, FINISH_LENGTH
from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import CostModel
from loraplex.sim.cpu import CpuShare
from loraplex.sim.decode_run import DecodeRun, run_length
from loraplex.sim.outcome import Outcome
from loraplex.sim.pipeline import CostModelPipeline

_TOKEN = 1  # the token every simulated step samples (no text is produced)


def cache_config(config: SimConfig) -> CacheConfig:
    """The cache ``engine.factory.build_adapter_runtime`` builds for the same settings."""
    slots, share = config.max_loras, config.default_tenant_tier_share
    return CacheConfig(
        budgets={
            Tier.L0: TierBudget(slots * config.slot_bytes, slots, default_tenant_share=share),
            Tier.L1: TierBudget(config.cpu_adapter_bytes, default_tenant_share=share),
            Tier.L2: TierBudget(config.disk_cache_bytes, default_tenant_share=share),
        },
        max_concurrent_loads=config.max_concurrent_loads,
        tenant_max_concurrent_loads=config.tenant_max_concurrent_loads,
        default_deadline_s=config.queue_deadline_s,
        auto_warm=AutoWarmConfig() if config.auto_warm else None,
        max_auto_gpu_slots=config.auto_gpu_slots,
    )


def scheduler_config(config: SimConfig) -> SchedulerConfig:
    return SchedulerConfig(
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=config.max_model_len,
        default_deadline_s=config.queue_deadline_s,
        max_queue_len=config.max_queue_len,
        step_work_ratio=config.step_work_ratio,
    )


_CAP_FIELDS = {Tier.L0: "max_gpu_bytes", Tier.L1: "max_cpu_bytes", Tier.L2: "max_disk_bytes"}


def apply_tenants(cache: TieredAdapterCache, tenants: Mapping[str, TenantSettings]) -> None:
    """The tenants' keep-priority weights and per-tier byte caps, handed to the cache as
    ``engine.factory.apply_tenant_settings`` hands them (that module loads torch)."""
    caps = {
        tier: {t: cap for t, s in tenants.items() if (cap := getattr(s, name)) is not None}
        for tier, name in _CAP_FIELDS.items()
    }
    cache.set_tenant_limits({t: s.weight for t, s in tenants.items()}, caps)


class AdapterShape(NamedTuple):
    """What the step cost reads of one adapter."""

    rank: int  # for the rank mix
    memory_bytes: int  # its weights' bytes (``byte_tokens``)
    width: float  # its bytes per rank (``revision_widths``)


def adapter_shapes(
    footprints: Mapping[AdapterKey, Footprint], ranks: Mapping[AdapterKey, int]
) -> dict[AdapterKey, AdapterShape]:
    """Every adapter's shape, made once per run and shared by its replicas (one table per
    replica was 64 copies of it in a scale run)."""
    return {
        k: AdapterShape(ranks[k], f.memory_bytes, f.memory_bytes / ranks[k])
        for k, f in footprints.items()
    }


class SimReplica:
    """Scheduler + adapter cache of one replica on the shared event queue."""

    def __init__(
        self,
        index: int,
        config: SimConfig,
        cost: CostModel,
        executor: SimExecutor,
        *,
        footprints: Mapping[AdapterKey, Footprint],
        shapes: Mapping[AdapterKey, AdapterShape],
        skip_steps: bool = True,
        cpu: CpuShare | None = None,
    ) -> None:
        self.index = index
        self.replica_id = f"replica-{index:03d}"
        self._executor = executor
        self._clock = executor.clock
        self._step_cost = cost.step
        # A fleet's replicas are co-located: steps and load stages cost the measured scale.
        self._cpu_scale = cost.fleet_cpu_scale if config.replicas > 1 else 1.0
        self._cpu = cpu  # the machine's shared cores (cost model's ``cores``), if modelled
        self._idle_wait_s = config.idle_wait_s
        self._shapes = shapes  # adapter -> its rank, bytes and bytes per rank (``_seconds``)
        self._in_step = False  # a step is running (its result not applied yet)
        self._load_debt_s = 0.0  # load CPU seconds that overlapped steps, due at the next step
        self.cache = TieredAdapterCache(
            cache_config(config),
            CostModelPipeline(
                footprints,
                cost,
                self._on_load_cpu if cost.load_cpu_shared else None,
                self._cpu_scale,
            ),
            policy=make_policy(config.eviction_policy),
            clock=self._clock,
            executor=executor,
        )
        apply_tenants(self.cache, config.tenants)
        cache = self.cache
        self._no_prefetches = AdapterLoads(lambda key: cache.is_resident(key, Tier.L0))
        blocks = BlockManager(config.num_kv_blocks, config.block_size)
        tenants = TenantBook(config.tenants)
        self.scheduler = Scheduler(scheduler_config(config), blocks, self._clock, tenants)
        self._outcomes: dict[str, Outcome] = {}  # live requests
        self._pending: dict[str, Future[Lease]] = {}  # ADAPTER_WAIT requests' lease futures
        # The cost model's lease hand-off per source tier ({}: none), and when each pending
        # request's completed lease reaches it (the engine collects it from then on).
        self._handoff = cost.lease_handoff_s
        self._handed_at: dict[str, float] = {}
        self._prefetching: dict[AdapterKey, Future[None]] = {}
        self._planning = False  # a plan is being made (a wake then changes nothing)
        self._next_plan: SimTimer | None = None  # the plan event due, if any
        self._next_plan_at = 0.0  # ... and when
        self.num_steps = 0  # steps executed (for the scale profile)
        self._skip_steps = skip_steps  # steady decode steps in bulk (``sim/decode_run.py``)
        self._steady = False  # the plan just made is a steady decode step
        self._run: DecodeRun | None = None  # the decode run in flight, if any
        self._run_end: SimTimer | None = None  # ... and its last step's event
        # Automatic warm rebalancing (the engine's LeaseDesk: once per interval, at a step).
        self._rebalance_interval_s = config.auto_warm_interval_s if config.auto_warm else None
        self._rebalance_at_s = self._clock.now() + (self._rebalance_interval_s or 0.0)

    # --- requests ---------------------------------------------------------------------------

    def submit(self, request: EngineRequest, outcome: Outcome) -> None:
        """The engine receives ``request`` now; a refusal ends ``outcome`` at once."""
        self._stop_run(outcome.t_s)  # the next plan sees the request (scheduled at its t_s)
        sched = self.scheduler
        try:
            sched.check_can_add(request)
        except LoraplexError as error:
            self._end(outcome, error)
            return
        victim = sched.push_out_victim(request)
        if victim is not None:
            cfg = sched.config
            share = f"tenant {victim.tenant!r}'s share of the engine queue"
            self._retire(
                victim,
                RequestState.ABORTED,
                QueueFullError(share, cfg.max_queue_len, cfg.retry_hint_s),
            )
        sched.add(request)
        self._outcomes[request.request_id] = outcome
        self._wake()

    def _wake(self) -> None:
        """Plan now, unless a step runs (it plans when it ends), a plan is being made (it sees
        the change) or one is due now."""
        if self._in_step or self._planning:
            return
        now = self._clock.now()
        if self._next_plan is not None:
            if self._next_plan_at <= now:
                return
            self._next_plan.cancel()  # an idle poll: the engine is woken early
        self._plan_at(now)

    def _plan_at(self, at_s: float) -> None:
        if self._next_plan is not None:
            self._next_plan.cancel()  # one plan event at a time
        self._next_plan_at = at_s
        self._next_plan = self._executor.call_at(at_s, self._plan)

    # --- the step ---------------------------------------------------------------------------

    def _plan(self) -> None:
        self._next_plan = None
        self._planning = True
        plan = self._decide(self._clock.now())
        self._planning = False
        now = self._clock.now()
        if not plan.chunks:
            self._load_debt_s = 0.0  # no step to delay
            if self.scheduler.requests:  # all wait (loads, quotas): poll as the engine loop does
                self._plan_at(now + self._idle_wait_s)
            return  # else idle until an arrival wakes it
        seconds = self._seconds(plan) * self._cpu_scale
        if self._cpu is not None:
            seconds *= self._cpu.stretch(now)
        steady = self._steady and not self._load_debt_s
        seconds += self._load_debt_s
        self._load_debt_s = 0.0
        self._in_step = True
        if self._cpu is not None:
            self._cpu.steps += 1
        if not (steady and self._start_run(plan, now, seconds)):
            self._executor.call_at(now + seconds, lambda: self._apply(plan))

    def _decide(self, now: float) -> StepPlan:
        """EngineCore.step's bookkeeping, then the scheduler's plan. With nothing queued the
        bookkeeping has nothing to do (no request can expire, wait for a lease or be in the
        prefetch window), so only its one effect is kept: the prefetch window empties."""
        self._rebalance(now)
        self._steady = False
        if not self.scheduler.num_queued:
            self._prefetching = {}
            plan = self.scheduler.schedule_decodes()
            self._steady = plan is not None
            return plan or self.scheduler.schedule()
        for req in self.scheduler.expired(now):
            retry_s = self.scheduler.config.retry_hint_s
            error = QueueTimeoutError(req.request_id, now - req.arrival_s, retry_s)
            self._retire(req, RequestState.ABORTED, error)
        self._collect_leases()
        self._request_leases()
        self._prefetch()
        return self.scheduler.schedule_decodes() or self.scheduler.schedule()

    def _apply(self, plan: StepPlan) -> None:
        sched = self.scheduler
        sampled = {c.request_id: _TOKEN for c in plan.chunks if c.samples}
        sched.update(plan, StepResult(sampled, {}))
        self._step_ended()
        self.num_steps += 1
        now = self._clock.now()
        for request_id in sampled:
            req = sched.requests.get(request_id)
            outcome = self._outcomes.get(request_id)
            if req is None or outcome is None:
                continue
            if outcome.first_token_s is None:
                outcome.first_token_s = now
            outcome.output_tokens = len(req.output_token_ids)
            # Ends as the engine's output tracker ends it: max_tokens, or the context is full.
            full = req.num_tokens >= sched.config.max_model_len
            if full or outcome.output_tokens >= req.request.params.max_tokens:
                self._retire(req, RequestState.FINISHED, None)
        self._plan()

    # --- decode runs (``sim/decode_run.py``) ----------------------------------------------------

    def settle(self) -> None:
        """Brings a decode run's skipped steps up to now, before the replica's state is read."""
        if self._run is not None:
            now = self._clock.now()
            self._run.catch_up(now, now)  # every step ending by now has ended

    def _start_run(self, plan: StepPlan, now: float, seconds: float) -> bool:
        """Runs ``plan`` and the identical steps after it as one event, if there are enough."""
        steps = run_length(self.scheduler, plan, self.scheduler.config.max_model_len)
        if not self._skip_steps or not steps:
            return False
        ends, end = [], now
        for _ in range(steps):
            end += seconds  # the step-by-step loop's float sums
            ends.append(end)
        if self._rebalance_interval_s is not None:  # plans before the next rebalance only
            while len(ends) > 1 and ends[-2] >= self._rebalance_at_s:
                ends.pop()
        if len(ends) < 2:
            return False
        self._run = DecodeRun(
            self.scheduler, plan, ends, self._apply_decode, self._advance_decodes, start_s=now
        )
        self._run_end = self._executor.call_at(ends[-1], self._finish_run)
        return True

    def _finish_run(self) -> None:
        run, self._run, self._run_end = self._run, None, None
        assert run is not None  # the event is cancelled when the run stops early
        run.finish()
        self._step_ended()
        self._plan()

    def _stop_run(self, scheduled_s: float | None = None) -> None:
        """Ends the run now (its next plans would differ): the step in flight ends as usual.
        ``scheduled_s``: when the event ending it was scheduled (``DecodeRun.catch_up``)."""
        run, timer = self._run, self._run_end
        if run is None or timer is None:
            return
        run.catch_up(self._clock.now(), scheduled_s)
        timer.cancel()
        self._run, self._run_end = None, None
        plan = run.plan
        self._executor.call_at(run.in_flight_end, lambda: self._apply(plan))

    def _apply_decode(self, plan: StepPlan) -> None:
        """A run's step applied: ``_apply`` less what cannot happen in a run (a first token, a
        finish, the next plan)."""
        sched = self.scheduler
        sampled = dict.fromkeys((c.request_id for c in plan.chunks), _TOKEN)
        sched.update(plan, StepResult(sampled, {}))
        self.num_steps += 1
        self._count_outputs(plan)

    def _advance_decodes(self, plan: StepPlan, num_steps: int) -> StepPlan | None:
        """``num_steps`` of ``_apply_decode`` and the scheduler's next plans at once (its
        ``advance_decodes``); None, nothing changed, where the scheduler declines."""
        following = self.scheduler.advance_decodes(plan, _TOKEN, num_steps)
        if following is None:
            return None
        self.num_steps += num_steps
        self._count_outputs(plan)
        return following

    def _count_outputs(self, plan: StepPlan) -> None:
        """Each decoded request's outcome takes its output token count after a run's steps."""
        requests = self.scheduler.requests
        for chunk in plan.chunks:
            req, outcome = requests.get(chunk.request_id), self._outcomes.get(chunk.request_id)
            if req is not None and outcome is not None:
                outcome.output_tokens = len(req.output_token_ids)

    def _step_ended(self) -> None:
        if self._in_step and self._cpu is not None:
            self._cpu.steps -= 1
        self._in_step = False

    def _on_load_cpu(self, seconds: float) -> None:
        """A load stage starts (``load_cpu_shared``) while the engine steps or plans a step: the
        engine loses its CPU for that long, so its next step pays it. An idle engine (a plan
        with nothing to run drops the debt) leaves the CPU to the loader."""
        if self._in_step or self._planning:
            self._stop_run()  # the next step pays the debt
            self._load_debt_s += seconds

    def _seconds(self, plan: StepPlan) -> float:
        """The cost model's step time: decode and prompt tokens, distinct revisions and their
        rank mix. A decode chunk is one token past the prompt (the last sampled token); every
        other chunk (a prompt chunk, a recompute after preemption) is prefill."""
        requests, shapes = self.scheduler.requests, self._shapes
        keys: set[AdapterKey] = set()
        rank_tokens = decode_tokens = byte_tokens = 0
        for chunk in plan.chunks:
            request = requests[chunk.request_id].request
            num = len(chunk.token_ids)
            if num == 1 and chunk.start_pos >= len(request.prompt_token_ids):
                decode_tokens += 1
            key = request.adapter_key
            if key is not None:
                keys.add(key)
                rank, nbytes, _ = shapes[key]
                rank_tokens += num * rank
                byte_tokens += num * nbytes
        prefill_tokens = plan.num_tokens - decode_tokens
        cost = self._step_cost
        if not cost.prices_weights:  # an older file: the old model's inputs, exactly
            return cost.seconds(decode_tokens, prefill_tokens, len(keys), rank_tokens)
        # An exact sum, so any set order gives it (of one width: that width, as fsum gives it).
        if len(keys) == 1:
            widths = shapes[next(iter(keys))].width
        else:
            widths = math.fsum(shapes[k].width for k in keys)
        return cost.seconds(
            decode_tokens,
            prefill_tokens,
            len(keys),
            rank_tokens,
            byte_tokens=byte_tokens,
            revision_widths=widths,
        )

    def _rebalance(self, now: float) -> None:
        """Automatic warm promotion/demotion, at most once per interval (LeaseDesk._rebalance)."""
        interval = self._rebalance_interval_s
        if interval is None or now < self._rebalance_at_s:
            return
        self._rebalance_at_s = now + interval
        self.cache.rebalance()

    # --- leases (as EngineCore does) ----------------------------------------------------------

    def _collect_leases(self) -> None:
        handed, now = self._handed_at, self._clock.now()
        for request_id, future in list(self._pending.items()):
            if future.done() and (not handed or handed.get(request_id, now) <= now):
                del self._pending[request_id]
                handed.pop(request_id, None)
                self._settle(self.scheduler.requests[request_id], future)

    def _request_leases(self) -> None:
        sched = self.scheduler
        for req in sched.lease_candidates(self._adapter_loads()):
            key = req.request.adapter_key
            if key is None:
                continue
            remaining = max(req.deadline_at_s - self._clock.now(), 1e-3)
            future = self.cache.acquire_future(key, deadline_s=remaining)
            if future.done():
                self._settle(req, future)
            else:
                sched.wait_for_adapter(req)
                self._pending[req.request_id] = future
                if self._handoff:
                    future.add_done_callback(partial(self._hand_over, req.request_id))
                else:
                    future.add_done_callback(lambda _: self._wake())

    def _hand_over(self, request_id: str, future: Future[Lease]) -> None:
        """A waiting lease's load completed: it reaches its request after the cost model's
        hand-off for the tier it was loaded from (a failure at once), then the engine wakes."""
        delay = 0.0
        if not future.cancelled() and future.exception() is None:
            delay = self._handoff.get(future.result().load.source.name, 0.0)
        if request_id in self._pending and delay > 0:
            at = self._clock.now() + delay
            self._handed_at[request_id] = at
            self._executor.call_at(at, self._wake)
            return
        self._wake()

    def _settle(self, req: Request, future: Future[Lease]) -> None:
        error = future.exception()
        if error is not None:
            self._retire(req, RequestState.ABORTED, self.scheduler.on_lease_failed(req, error))
            return
        lease = future.result()
        outcome = self._outcomes.get(req.request_id)
        if outcome is not None:
            outcome.tier = lease.load.source.name
        self.scheduler.on_lease(req, lease)

    def _prefetch(self) -> None:
        sched = self.scheduler
        window = {k: self._prefetching.get(k) for k in sched.prefetch_keys()}
        fresh = [k for k, f in window.items() if f is None]
        for key in sched.admit_prefetches(fresh, self._adapter_loads()):
            future = self.cache.prefetch(key, Tier.L1)
            future.add_done_callback(lambda _: self._wake())  # its quota place is free again
            window[key] = future
        self._prefetching = {k: f for k, f in window.items() if f is not None}

    def _adapter_loads(self) -> AdapterLoads:
        """What the scheduler reads of the cache's copies now (one object while no prefetch is
        in flight: it asks the cache itself)."""
        in_flight = frozenset(k for k, f in self._prefetching.items() if not f.done())
        if not in_flight:
            return self._no_prefetches
        return AdapterLoads(self._no_prefetches.in_gpu, in_flight)

    def _retire(self, req: Request, state: RequestState, error: BaseException | None) -> None:
        future = self._pending.pop(req.request_id, None)
        self._handed_at.pop(req.request_id, None)
        if future is not None:  # its lease may still come: release it then
            future.add_done_callback(_release_if_granted)
        reason = FINISH_LENGTH if state is RequestState.FINISHED else FINISH_ABORT
        self.scheduler.finish(req, state, reason)
        outcome = self._outcomes.pop(req.request_id, None)
        if outcome is not None:
            self._end(outcome, error)

    def _end(self, outcome: Outcome, error: BaseException | None) -> None:
        _end(outcome, self._clock.now(), error)
        if self._cpu is not None:
            self._cpu.requests -= 1  # counted in at its arrival (``sim/run.py``)

    @property
    def num_live(self) -> int:
        return len(self._outcomes)


def _end(outcome: Outcome, now_s: float, error: BaseException | None) -> None:
    outcome.end_s = now_s
    if error is not None:
        outcome.error = type(error).__name__


def _release_if_granted(future: Future[Lease]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().release()
