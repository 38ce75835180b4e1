"""One simulated engine replica: the real scheduler and adapter cache, stepped on the virtual
clock, with the runner replaced by the cost model's step time.

The glue mirrors ``engine.core.EngineCore.step`` (the lease desk's phases, ``sim/lease_desk.py``:
expire, collect leases, ask for leases in the scheduler's lease window, prefetch; then schedule
and update): every decision is the scheduler's or the cache's own; this class only carries them
and charges time (``sim/step_cost.py``). A step is one event: planned at
``t``, its result applied at ``t + step_s`` (no request can join a step already running), then
the next step is planned at once. An idle replica plans again when a request arrives; one whose
requests all wait (for adapter loads, a load quota) plans again when a lease it waits for
completes, or after ``idle_wait_s`` (the engine loop's sleep when nothing can run), so queue
deadlines expire on time. A steady decode batch runs its identical steps as one event
(``sim/decode_run.py``), caught up whenever something touches the replica first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.kv.blocks import BlockManager
from loraplex.engine.protocol import EngineRequest
from loraplex.engine.request import Request, RequestState
from loraplex.engine.sched.scheduler import Scheduler
from loraplex.engine.step import StepPlan, StepResult
from loraplex.engine.tenant_shares import TenantBook
from loraplex.errors import LoraplexError, QueueFullError
from loraplex.residency.cache import SimExecutor, TieredAdapterCache
from loraplex.residency.cache.executors import SimTimer
from loraplex.residency.ledger import Tier
from loraplex.residency.pipeline import Footprint
from loraplex.residency.policy import make_policy
from loraplex.router.placement import rank_name
from loraplex.sampling import FINISH_ABORT, FINISH_LENGTH
from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import CostModel
from loraplex.sim.cpu import CpuShare
from loraplex.sim.decode_run import DecodeRun, run_length
from loraplex.sim.engine_settings import apply_tenants, cache_config, scheduler_config
from loraplex.sim.lease_desk import SimLeaseDesk
from loraplex.sim.outcome import Outcome
from loraplex.sim.pipeline import CostModelPipeline
from loraplex.sim.step_cost import AdapterShape, step_seconds

_TOKEN = 1  # the token every simulated step samples (no text is produced)


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
        replica_id: str | None = None,
    ) -> None:
        self.index = index
        # the router's id of it (a fleet places cold revisions by hashing it)
        # the real fleet's router names replicas by deployment rank (``rank_name``), not by id
        self.replica_id = rank_name(index) if replica_id is None else replica_id
        self._executor = executor
        self._clock = executor.clock
        self._step_cost = cost.step
        # A fleet's replicas are co-located: steps and load stages cost the measured scale.
        self._cpu_scale = cost.fleet_cpu_scale if config.replicas > 1 else 1.0
        load_scale = cost.fleet_load_scale  # the loads' own, where measured
        self._load_scale = (
            self._cpu_scale if load_scale is None or config.replicas == 1 else load_scale
        )
        self._cpu = cpu  # the machine's shared cores (cost model's ``cores``), if modelled
        self._idle_wait_s = config.idle_wait_s
        self._shapes = shapes  # adapter -> its rank, bytes and bytes per rank (``step_seconds``)
        self._in_step = False  # a step is running (its result not applied yet)
        self._step_end_s = 0.0  # ... and when it ends (a decode run's: when it was stopped)
        # the revision a fleet's topology asked this replica to merge (``sim/fleet.py``), as a
        # real ``auto`` engine's ``MergeHolds.dedicate``; None: none
        self.dedicated: AdapterKey | None = None
        # told of every request's end (its id; whether it had a first token): a fleet's
        # topology uncounts the ones that had none (``sim/fleet.py``); None: no one
        self.on_end: Callable[[str, bool], None] | None = None
        self._load_debt_s = 0.0  # load CPU seconds that overlapped steps, due at the next step
        self._first_step_s = cost.first_step_s  # a fresh process's first forward; spent by it
        self.cache = TieredAdapterCache(
            cache_config(config),
            CostModelPipeline(
                footprints,
                cost,
                self._on_load_cpu if cost.load_cpu_shared else None,
                self._load_scale,
                busy=self._engine_busy,
                lock_wait=self._lock_wait,
            ),
            policy=make_policy(config.eviction_policy),
            clock=self._clock,
            executor=executor,
        )
        apply_tenants(self.cache, config.tenants)
        blocks = BlockManager(config.num_kv_blocks, config.block_size)
        tenants = TenantBook(config.tenants)
        self.scheduler = Scheduler(scheduler_config(config), blocks, self._clock, tenants)
        self._outcomes: dict[str, Outcome] = {}  # live requests
        self._planning = False  # a plan is being made (a wake then changes nothing)
        self._next_plan: SimTimer | None = None  # the plan event due, if any
        self._next_plan_at = 0.0  # ... and when
        self.num_steps = 0  # steps executed (for the scale profile)
        self._skip_steps = skip_steps  # steady decode steps in bulk (``sim/decode_run.py``)
        self._steady = False  # the plan just made is a steady decode step
        self._run: DecodeRun | None = None  # the decode run in flight, if any
        self._run_end: SimTimer | None = None  # ... and its last step's event
        self._leases = SimLeaseDesk(
            self.scheduler,
            self.cache,
            executor,
            outcomes=self._outcomes,
            retire=self._abort,
            wake=self._wake,
            handoff_s=cost.lease_handoff_s,
            ask_s=cost.lease_ask_s,
            rebalance_interval_s=config.auto_warm_interval_s if config.auto_warm else None,
        )

    def merged(self) -> AdapterKey | None:
        """The revision merged into its base weights now: the dedicated one, once a copy of it
        is ready in its GPU slots (a real ``auto`` engine merges a dedicated revision as soon
        as a lease on it is granted: ``engine/mode_control.py``); no transition is charged."""
        key = self.dedicated
        if key is None:
            return None
        entry = self.cache.ledgers[Tier.L0].entries.get(key)
        return key if entry is not None and entry.ready else None

    # --- requests ---------------------------------------------------------------------------

    def submit(self, request: EngineRequest, outcome: Outcome) -> None:
        """The engine receives ``request`` now; a refusal ends ``outcome`` at once."""
        self._stop_run(outcome.t_s)  # the next plan sees the request (scheduled at its t_s)
        sched = self.scheduler
        try:
            sched.check_can_add(request)
        except LoraplexError as error:
            self._end(request.request_id, outcome, error)
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
        self._planning = True  # also while the desk waits for copies: a wake changes nothing
        queued = self._leases.advance(self._clock.now())
        if self._leases.asking:  # a miss's ask holds the engine thread (``lease_ask_s``)
            self._leases.after_asks(partial(self._after_leases, queued))
            return
        self._after_leases(queued)

    def _after_leases(self, queued: bool) -> None:
        """The request phase ended: the wait for copies from host memory, then the step."""
        if not self._leases.await_copies(partial(self._start_step, queued)):
            self._start_step(queued)

    def _start_step(self, queued: bool) -> None:
        """The scheduler's plan (the lease desk's phases ran), priced and started."""
        plan = self._decide(queued)
        self._planning = False
        now = self._clock.now()
        if not plan.chunks:
            self._load_debt_s = 0.0  # no step to delay
            if self.scheduler.requests:  # all wait (loads, quotas): poll as the engine loop does
                self._plan_at(now + self._idle_wait_s)
            return  # else idle until an arrival wakes it
        seconds = step_seconds(
            plan, self.scheduler.requests, self._shapes, self._step_cost, self.merged()
        )
        seconds *= self._cpu_scale
        if self._cpu is not None:
            seconds *= self._cpu.stretch(now)
        steady = self._steady and not self._load_debt_s and not self._first_step_s
        seconds += self._load_debt_s + self._first_step_s
        self._first_step_s = 0.0
        self._load_debt_s = 0.0
        self._in_step = True
        if self._cpu is not None:
            self._cpu.steps += 1
        self._step_end_s = now + seconds
        if not (steady and self._start_run(plan, now, seconds)):
            self._executor.call_at(now + seconds, lambda: self._apply(plan))

    def _decide(self, queued: bool) -> StepPlan:
        """The scheduler's plan after EngineCore.step's bookkeeping (``sim/lease_desk.py``;
        ``queued``: a request was queued then); a steady decode step (nothing queued) may start
        a decode run."""
        self._steady = False
        if not queued:
            plan = self.scheduler.schedule_decodes()
            self._steady = plan is not None
            return plan or self.scheduler.schedule()
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
        # With the machine's CPU modelled a run keeps its first step's factor (``sim/cpu.py``):
        # the step that finishes a request is then planned on its own, as before.
        steps = run_length(
            self.scheduler,
            plan,
            self.scheduler.config.max_model_len,
            through_finish=self._cpu is None,
        )
        if not self._skip_steps or not steps:
            return False
        ends, end = [], now
        for _ in range(steps):
            end += seconds  # the step-by-step loop's float sums
            ends.append(end)
        if self._leases.rebalance_interval_s is not None:  # plans before the next rebalance only
            while len(ends) > 1 and ends[-2] >= self._leases.rebalance_at_s:
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
        self._apply(run.finish())  # the last step as an ordinary one: it may finish requests

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
        self._step_end_s = run.in_flight_end
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

    def _engine_busy(self) -> bool:
        """Whether the engine has requests running (a load stage then shares the CPU with
        steps: ``CostModel.load_busy_scale``)."""
        return bool(self.scheduler.running)

    def _lock_wait(self) -> float:
        """Seconds until the step in flight ends (0 with none): a copy into a slot that starts
        now waits that long for the slot lock (``CostModel.copy_waits_for_step``)."""
        if not self._in_step:
            return 0.0
        self._stop_run()  # a decode run's step in flight ends as an ordinary step
        return max(0.0, self._step_end_s - self._clock.now())

    def _on_load_cpu(self, seconds: float) -> None:
        """A load stage starts (``load_cpu_shared``) while the engine steps or plans a step: the
        engine loses its CPU for that long, so its next step pays it. An idle engine (a plan
        with nothing to run drops the debt) leaves the CPU to the loader."""
        if self._in_step or self._planning:
            self._stop_run()  # the next step pays the debt
            self._load_debt_s += seconds

    def _retire(self, req: Request, state: RequestState, error: BaseException | None) -> None:
        self._leases.abandon(req.request_id)  # its lease may still come: released then
        reason = FINISH_LENGTH if state is RequestState.FINISHED else FINISH_ABORT
        self.scheduler.finish(req, state, reason)
        outcome = self._outcomes.pop(req.request_id, None)
        if outcome is not None:
            self._end(req.request_id, outcome, error)

    def _abort(self, req: Request, error: BaseException) -> None:
        self._retire(req, RequestState.ABORTED, error)

    def _end(self, request_id: str, outcome: Outcome, error: BaseException | None) -> None:
        _end(outcome, self._clock.now(), error)
        if self.on_end is not None:
            self.on_end(request_id, outcome.first_token_s is not None)
        if self._cpu is not None:
            self._cpu.requests -= 1  # counted in at its arrival (``sim/run.py``)

    @property
    def num_live(self) -> int:
        return len(self._outcomes)


def _end(outcome: Outcome, now_s: float, error: BaseException | None) -> None:
    outcome.end_s = now_s
    if error is not None:
        outcome.error = type(error).__name__
