"""``auto`` inside a ``bench modes`` replay (``replay.py``): the engine's decision loop over
the bench's ``Setup``.

Before every step it decides with the production decision code
(:func:`~loraplex.engine.mode_policy.decide`) over a :class:`TokenWindow` of the replay's own
tokens on the wall clock, its merged / unmerged step costs (``mode_costs.StepCosts``) and the LoRA
op's cost per token timed on every unmerged step until measured, then one in ``LORA_TIMING_EVERY``
(:class:`LoraCostMeter`; no merge before it is measured), as ``engine/mode_control.py`` does.
"""

from __future__ import annotations

import time
from dataclasses import replace

from loraplex.bench.modes.setup import Setup
from loraplex.engine.mode_control import LORA_TIMING_EVERY
from loraplex.engine.mode_costs import StepCosts
from loraplex.engine.mode_policy import (
    Action,
    LoraCostMeter,
    MeasuredCosts,
    ModeDecision,
    ModePolicyConfig,
    TokenWindow,
    decide,
)
from loraplex.model.buffers import ARENA_RELEASE_BYTES
from loraplex.model.llama import LoraApplier
from loraplex.model.lora import OpTimer
from loraplex.model.staged_merge import MergeStaging


class AutoMode:
    """``auto`` inside a replay: the engine's decision loop over the bench's ``Setup``."""

    def __init__(self, setup: Setup, costs: MeasuredCosts, config: ModePolicyConfig) -> None:
        self.setup, self.costs, self.config = setup, costs, config
        self.window = TokenWindow(config.window_s, time.perf_counter())
        self.step_costs = StepCosts(min_steps=config.min_measured_steps)
        self.lora_cost = LoraCostMeter(
            costs.lora_s_per_token, min_samples=config.min_measured_steps
        )
        self._steps = 0  # steps run (one unmerged step in LORA_TIMING_EVERY is timed)
        self._timer: OpTimer | None = None
        self.merged: int | None = None
        self.applier: LoraApplier = setup.pool
        self.last_s: float | None = None
        self.transitions = 0
        self._staging: tuple[int, MergeStaging] | None = None  # a merge under way: slot, staging
        self.stalls_ms: list[float] = []  # per transition: what the step after it waited
        self.staging_ms: list[float] = []  # per merge: its staging work, all boundaries
        self.staging_steps: list[int] = []  # per merge: the boundaries its staging took

    def before_step(self, now: float) -> None:
        self._decide(now)
        if self.merged is None and self.lora_cost.due(self._steps, LORA_TIMING_EVERY):
            pool = self.setup.pool
            self._timer = pool.op_timer = OpTimer(pool.device)

    def _decision(self, now: float, merged: int | None, since: float | None) -> ModeDecision:
        self.step_costs.expire(now, self.config.veto_s)
        costs = replace(
            self.costs,
            lora_s_per_token=self.lora_cost.per_token(),
            merged_step_s_per_token=self.step_costs.merged_like_unmerged(),
            unmerged_step_s_per_token=self.step_costs.per_token(False),
            lora_measured=self.lora_cost.measured,
        )
        ref = None if merged is None else str(merged)
        return decide(ref, since, self.window.share(now), costs, self.config)

    def _decide(self, now: float) -> None:
        # as the engine's ModeController.before_step: a piece of an unmerged arena first
        self.setup.merger.releases.step(ARENA_RELEASE_BYTES)
        if self._staging is not None:
            self._stage(now, *self._staging)
            return
        since = None if self.last_s is None else now - self.last_s
        got = self._decision(now, self.merged, since)
        if got.action is Action.STAY:
            return
        if self.merged is not None:
            start = time.perf_counter()
            self.setup.unmerge(release_now=False)  # freed by pieces at the next boundaries
            self.stalls_ms.append((time.perf_counter() - start) * 1000)
            self.merged, self.applier = None, self.setup.pool
            self.transitions += 1
            self.last_s = time.perf_counter()
        if got.action in (Action.MERGE, Action.SWITCH) and got.revision is not None:
            slot = int(got.revision)
            start = time.perf_counter()
            staging = self.setup.begin_merge(slot)
            staging.seconds += time.perf_counter() - start
            self._stage(now, slot, staging)

    def _stage(self, now: float, slot: int, staging: MergeStaging) -> None:
        """The engine's staged merge (engine/mode_control.py): a budgeted piece per boundary,
        the commit at the boundary that stages the last one; abandoned when, were it merged,
        the decision would unmerge it or switch."""
        if self._decision(now, slot, None).action in (Action.UNMERGE, Action.SWITCH):
            self.setup.abandon(staging)
            self._staging = None
            return
        if not staging.done:
            staging.advance(self.config.merge_step_budget_s)
        if not staging.done:
            self._staging = (slot, staging)
            return
        start = time.perf_counter()
        self.applier = self.setup.commit(staging, slot)
        self.stalls_ms.append((time.perf_counter() - start) * 1000)
        self.staging_ms.append(staging.seconds * 1000)
        self.staging_steps.append(staging.num_calls)
        self._staging, self.merged = None, slot
        self.transitions += 1
        self.last_s = time.perf_counter()

    def after_step(self, now: float, seconds: float, chunks: list[tuple[int | None, int]]) -> None:
        self.step_costs.record(self.merged is not None, seconds, sum(n for _, n in chunks))
        for slot, num_tokens in chunks:
            self.window.record(now, None if slot is None else str(slot), num_tokens)
        self._steps += 1
        timer, self._timer = self._timer, None
        if timer is not None:
            self.setup.pool.op_timer = None
            self.lora_cost.record(timer.seconds, sum(n for s, n in chunks if s is not None))

    def close(self) -> None:
        if self._timer is not None:
            self._timer = self.setup.pool.op_timer = None
        if self._staging is not None:
            self.setup.abandon(self._staging[1])
            self._staging = None
        if self.merged is not None:
            self.setup.unmerge()
            self.merged, self.applier = None, self.setup.pool
