"""Steps skipped in bulk: a replica's steady decode batch advanced by one event, not one per step.

Between two events that touch a replica (a request reaching it, a request finishing, a load
stage delaying its steps, a routing report reading it) a batch where nothing is queued and every
running request decodes one token is planned the same way at every step (the scheduler's
``schedule_decodes``) and costs the same time. A ``DecodeRun`` stands for such steps: it knows
when each would end (each end is the previous one plus the step's seconds, the float sum the
step-by-step loop makes), and applies them to the scheduler only when their effects are read:

- at its last step (one event, at that step's end): the steps before it are applied here, the
  last one by the replica as an ordinary step (``finish``: first tokens, finishes, the next
  plan);
- when something touches the replica first (``catch_up(now)``): the steps that ended before
  ``now`` are applied and the next one is planned, exactly the state the step-by-step loop has
  at ``now``; a touch that changes what the next plan sees (a request arriving, a load's CPU
  debt) then ends the run and the step in flight continues as an ordinary step event.

The run is sized so that no step in it but the last finishes a request (where the machine's CPU
is modelled, none: a run keeps its first step's factor, ``sim/cpu.py``, and the finishing step
reads its own), nor plans at or after the next automatic warm rebalance, and so that the KV
blocks for all of it are free; none starts where a request's step is its prompt's last token (a
chunked prefill's last chunk of one token: that step samples the request's first token, its
TTFT) nor while a tenant is over its equal share (the step-share rule may hold it back as its
contexts grow); every plan made in it is the
scheduler's own (``schedule_decodes``), so a run computes what the step-by-step loop computes.
An event at the very instant a skipped step ends is ordered as the step-by-step loop orders
the tie, by when each was scheduled (``catch_up``'s ``scheduled_s``; unknown: the event first).
"""

from __future__ import annotations

from collections.abc import Callable

from loraplex.engine.sched.scheduler import Scheduler
from loraplex.engine.step import StepPlan

MIN_STEPS = 2  # a run shorter than this saves nothing


def run_length(
    sched: Scheduler, plan: StepPlan, max_model_len: int, *, through_finish: bool = False
) -> int:
    """How many steps, ``plan`` first, can run before one of them finishes a request (the step
    that finishes one is the run's successor, planned as usual), within the free KV blocks;
    none where a request has no output yet (its step is its prompt's last token and samples its
    first token) or while a tenant is over its equal share (its decodes may be held back as they
    grow). ``through_finish``: the step that finishes the first request is the run's last (its
    caller applies the last step as an ordinary step: ``DecodeRun.finish``)."""
    if not sched.steady_as_contexts_grow():
        return 0
    requests = sched.requests
    steps = None
    for chunk in plan.chunks:
        req = requests[chunk.request_id]
        if not req.output_token_ids:
            # The last token of a chunked prefill (``schedule_decodes`` plans it as a decode):
            # the step samples its first token, which a run's steps do not record.
            return 0
        # Applying the run's i-th step (1-based) leaves len(output) + i tokens out, and the
        # context at num_tokens + i; the request ends at max_tokens or a full context.
        left = req.request.params.max_tokens - len(req.output_token_ids)
        room = max_model_len - req.num_tokens
        fits = min(left, room) - (0 if through_finish else 1)
        steps = fits if steps is None else min(steps, fits)
    if steps is None or steps < MIN_STEPS:
        return 0
    # Plans 2..steps grow each sequence to num_tokens + steps - 1 positions.
    blocks = sched.blocks
    needed = sum(blocks.blocks_needed(c.seq_id, c.start_pos + steps) for c in plan.chunks)
    return steps if needed <= blocks.num_free else 0


class DecodeRun:
    """Steps ``plan`` and the ``num_steps - 1`` identical decode steps after it, ending at
    ``ends``; ``apply`` records one step's result (the replica's per-step bookkeeping),
    ``advance`` applies several and plans the next (``Scheduler.advance_decodes`` with the
    replica's bookkeeping; None: not in bulk, then they are stepped one by one)."""

    def __init__(
        self,
        sched: Scheduler,
        plan: StepPlan,
        ends: list[float],
        apply: Callable[[StepPlan], None],
        advance: Callable[[StepPlan, int], StepPlan | None],
        *,
        start_s: float,
    ) -> None:
        self._sched = sched
        self._apply = apply
        self._advance = advance
        self.plan = plan  # the step in flight: planned, not applied
        self.start_s = start_s  # when ``plan`` was planned (its end scheduled)
        self.ends = ends  # when each step of the run ends, in order
        self.applied = 0  # steps of the run applied so far

    @property
    def in_flight_end(self) -> float:
        """When the step in flight ends."""
        return self.ends[self.applied]

    def catch_up(self, now_s: float, scheduled_s: float | None = None) -> None:
        """Applies the steps that ended before ``now_s`` and plans the one in flight then. A
        step ending at ``now_s`` itself ended first where the step-by-step loop had scheduled
        its end (at the previous step's end) by ``scheduled_s``, when the touching event was
        scheduled (None: unknown, the touch comes first)."""
        last, ended, ends = len(self.ends) - 1, self.applied, self.ends
        while ended < last and ends[ended] < now_s:
            ended += 1
        if (
            scheduled_s is not None
            and ended < last
            and ends[ended] == now_s
            and (self.start_s if ended == 0 else ends[ended - 1]) <= scheduled_s
        ):
            ended += 1
        self._steps(ended - self.applied)

    def finish(self) -> StepPlan:
        """Applies every step left but the last (its end is now) and gives the last's plan back:
        the caller applies it as an ordinary step (it may finish a request)."""
        self._steps(len(self.ends) - 1 - self.applied)
        self.applied += 1
        return self.plan

    def _steps(self, num_steps: int) -> None:
        """Applies ``num_steps`` steps and plans the next: in bulk, or one by one."""
        if num_steps < 1:
            return
        plan = self._advance(self.plan, num_steps)
        if plan is not None:
            self.plan = plan
            self.applied += num_steps
            return
        for _ in range(num_steps):
            self._step()

    def _step(self) -> None:
        self._apply(self.plan)
        self.applied += 1
        plan = self._sched.schedule_decodes()
        if plan is None:  # the run was sized so that this cannot happen
            raise RuntimeError("a decode run's next step is not a steady decode step")
        self.plan = plan
