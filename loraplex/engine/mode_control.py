"""The ``mode`` setting at work in one engine: it counts each step's tokens per revision and,
between steps, merges, unmerges or switches through :class:`~loraplex.engine.modes.ModeSwitcher`.

- ``unmerged``: nothing happens (the controller is not even built).
- ``merged:<tenant/name@revision>``: the named revision is merged as soon as a lease on it is
  granted (asked for at the first step that names it), and stays merged.
- Every merge is begun once its lease is granted and then, on a CPU, staged: a piece of about
  ``merge_step_budget_s`` at each step boundary, the revision served unmerged meanwhile, and
  committed at the boundary that stages its last piece. A staging this engine no longer wants
  (another revision dedicated, ``auto``'s traffic moved, ``close``) is abandoned, its lease
  released; an admin hold is checked at the commit.
- ``auto`` with a fleet's dedication (``MergeHolds.dedicate``, docs/modes.md "Topology"): the
  dedicated revision is merged as soon as a lease on it is granted, like ``merged:<ref>``.
- ``auto``: :func:`~loraplex.engine.mode_policy.decide` on the recent token share, with the
  transition cost measured by the switcher, the per-token LoRA cost measured here (the pool's
  LoRA work timed on every unmerged step until ``min_measured_steps`` were timed, then on one
  in ``LORA_TIMING_EVERY``; nothing is merged on the ``lora_s_per_token`` prior), and whole
  steps' seconds per token timed here in both modes: nothing is merged before
  ``min_measured_steps`` unmerged steps were timed, and once merged steps are measured slower
  than unmerged steps of the same size, auto unmerges and stays unmerged for ``veto_s``.

``auto``'s lease on the revision it merges names the tenant whose requests carried most of that
revision's tokens in the window (``payer``): a load it starts is charged to that tenant, as the
lease desk's ask of one of its requests would be; ``merged:<ref>`` and a fleet's dedication are
the operator's choice and name no tenant (the owner is charged). NOTE: ``auto`` merges what the
traffic makes hot, and a caller of another tenant's public adapter makes it hot: naming no tenant
there charged the owner for the caller's copy, held by the merge's lease (attack26).

A revision whose merge was refused (``ModeSwitcher.refused``: its delta would swamp the base
weights) is never asked for again, in any mode: no lease, no transition, no flapping.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Mapping
from concurrent.futures import Future
from dataclasses import replace

from loraplex.artifacts.identity import AdapterKey
from loraplex.clock import Clock
from loraplex.engine.mode_costs import StepCosts
from loraplex.engine.mode_policy import (
    Action,
    LoraCostMeter,
    MeasuredCosts,
    ModeDecision,
    ModeKind,
    ModePolicyConfig,
    ModeSetting,
    TokenWindow,
    decide,
)
from loraplex.engine.mode_report import ModeReport
from loraplex.engine.modes import ModeSwitcher, Transition
from loraplex.engine.sched.stats import QueueView
from loraplex.engine.step import StepPlan
from loraplex.model.lora import OpTimer
from loraplex.residency.cache.jobs import Lease
from loraplex.residency.cache.tiered_cache import TieredAdapterCache

TRANSITION_PRIOR_S = 0.05  # assumed transition cost until one has been measured
# ``auto`` times the pool's LoRA work on one unmerged step in this many (the rest run untimed;
# on a CUDA device a timed step synchronizes around each LoRA call)
LORA_TIMING_EVERY = 8


def ref_of(key: AdapterKey) -> str:
    """``tenant/name@revision``: how settings and traces name a revision."""
    return f"{key.tenant}/{key.name}@{key.revision}"


class ModeController:
    """Applies one engine's ``mode`` setting between steps."""

    def __init__(
        self,
        setting: ModeSetting,
        switcher: ModeSwitcher,
        cache: TieredAdapterCache,
        clock: Clock,
        *,
        policy: ModePolicyConfig | None = None,
        lora_s_per_token: float = 2e-4,
    ) -> None:
        if setting.kind is ModeKind.UNMERGED:
            raise ValueError("mode 'unmerged' is invalid here; expected no controller for it")
        if not lora_s_per_token >= 0:
            raise ValueError(f"lora_s_per_token {lora_s_per_token} is invalid; expected >= 0")
        self.setting = setting
        self.switcher = switcher
        self.cache = cache
        self.clock = clock
        self.policy = policy or ModePolicyConfig()
        # the prior until measured (LoraCostMeter)
        self.lora_cost = LoraCostMeter(lora_s_per_token, min_samples=self.policy.min_measured_steps)
        self.window = TokenWindow(self.policy.window_s, clock.now())
        # the same tokens per (revision, tenant), labelled ``payer_label``: whose traffic it is
        self.payers = TokenWindow(self.policy.window_s, clock.now())
        self.transitions: list[Transition] = []
        self._keys: dict[str, AdapterKey] = {}  # ref -> key of revisions seen in steps
        self._pending: Future[Lease] | None = None  # lease asked for the revision to merge
        self._pending_ref: str | None = None
        self._last_s: float | None = None
        self.step_costs = StepCosts(min_steps=self.policy.min_measured_steps)
        self._step_start_s: float | None = None
        self._steps_run = 0  # steps that ran a batch (the LoRA timing samples among them)
        self._timer: OpTimer | None = None  # the pool's LoRA work on this step, when measured
        text = ModeKind.AUTO.value if setting.revision is None else f"merged:{setting.revision}"
        self.report = ModeReport(text, None)  # published with every queue view (``stamp``)

    def stamp(self, view: QueueView) -> QueueView:
        """``view`` carrying this engine's mode report (to /metrics, admin guards, routers)."""
        return replace(view, mode=self.report)

    def after_step(
        self,
        plan: StepPlan,
        keys: Mapping[str, AdapterKey | None],
        tenants: Mapping[str, str] | None = None,
        probes: Collection[str] = (),
    ) -> None:
        """Count the step's tokens; ``keys``: request id -> its revision (None: base model);
        ``tenants``: request id -> its tenant (None: not known, the owner pays a merge);
        ``probes``: ids of a release's output probes (``EngineRequest.probe``), timed with the
        step's LoRA work but not counted in the token windows: they are no tenant's traffic."""
        now = self.clock.now()
        if self._step_start_s is not None:
            merged = self.switcher.merged_revision is not None
            self.step_costs.record(merged, now - self._step_start_s, plan.num_tokens)
            self._step_start_s = None
        self._steps_run += 1
        lora_tokens = 0
        for chunk in plan.chunks:
            key = keys.get(chunk.request_id)
            ref = None if key is None else ref_of(key)
            if key is not None and ref is not None:
                self._keys[ref] = key
                lora_tokens += len(chunk.token_ids)
            if chunk.request_id in probes:
                continue
            self.window.record(now, ref, len(chunk.token_ids))
            tenant = None if tenants is None else tenants.get(chunk.request_id)
            if ref is not None and tenant is not None:
                self.payers.record(now, payer_label(ref, tenant), len(chunk.token_ids))
        timer = self._stop_timing()
        if timer is not None:
            self.lora_cost.record(timer.seconds, lora_tokens)
            if self.lora_cost.measured:
                self.report = replace(self.report, lora_s_per_token=self.lora_cost.per_token())

    def before_step(self) -> list[Transition]:
        """Finish a pending merge, or decide whether one (or an unmerge) is due; returns the
        transitions made (live traced requests note them: they waited for them)."""
        self._step_start_s = None
        self._stop_timing()  # a timed step that ran no batch
        seen = len(self.transitions)
        self.switcher.release_step()  # a piece of the merged weights an unmerge dropped
        try:
            self._transition()
        finally:  # the step that follows is timed from here, after any transition
            self._step_start_s = self.clock.now()
            self._start_timing()
        return self.transitions[seen:]

    def _start_timing(self) -> None:
        """Time the pool's LoRA work in the coming step when it is an unmerged ``auto`` step
        due for a sample (merged steps run another op: they say nothing of the unmerged one)."""
        if self.setting.kind is not ModeKind.AUTO or self.switcher.merged_revision is not None:
            return
        if self.lora_cost.due(self._steps_run, LORA_TIMING_EVERY):
            self._timer = self.switcher.pool.op_timer = OpTimer(self.switcher.pool.device)

    def _stop_timing(self) -> OpTimer | None:
        timer, self._timer = self._timer, None
        if timer is not None:
            self.switcher.pool.op_timer = None
        return timer

    def _transition(self) -> None:
        if self._pending is not None:
            self._finish_pending()
            return
        if self.switcher.staging_revision is not None:
            self._stage(self.switcher.staging_revision)
            return
        if self.setting.kind is ModeKind.MERGED:
            wanted = self.setting.revision
            if (
                wanted is not None
                and self.switcher.merged_revision is None
                and self._mergeable(wanted)
            ):
                self._ask(wanted)
            return
        dedicated = self.switcher.holds.dedicated  # a fleet's topology overrides ``auto``
        if dedicated is not None:
            self._follow(dedicated)
            return
        now = self.clock.now()
        since = None if self._last_s is None else now - self._last_s
        got = self._decide(self.switcher.merged_revision, since)
        if got.action in (Action.UNMERGE, Action.SWITCH):
            self._record(self.switcher.unmerge())
        if got.action in (Action.MERGE, Action.SWITCH) and got.revision is not None:
            self._ask(got.revision, self.payer(got.revision))

    def _decide(self, merged: str | None, since: float | None) -> ModeDecision:
        now = self.clock.now()
        self.step_costs.expire(now, self.policy.veto_s)
        costs = MeasuredCosts(
            self._transition_s(),
            self.lora_cost.per_token(),
            self.step_costs.merged_like_unmerged(),
            self.step_costs.per_token(False),
            self.lora_cost.measured,
        )
        traffic = self.window.share(now)
        return decide(merged, since, traffic, costs, self.policy, refused=self.switcher.refused)

    def _stage(self, ref: str) -> None:
        """The next piece of ``ref``'s staged merge (its commit once all is staged), or its
        abandon when this engine no longer wants it merged."""
        if self._unwanted(ref):
            self.switcher.abandon()
        else:
            transition = self.switcher.advance(self.policy.merge_step_budget_s)
            if transition is not None:
                self._record(transition)
        self.report = replace(self.report, staging_revision=self.switcher.staging_revision)

    def _unwanted(self, ref: str) -> bool:
        """Whether a merge of ``ref`` under way is no longer wanted: another revision dedicated
        by the fleet, or (``auto``) traffic that would unmerge it or switch, were it merged."""
        if self.setting.kind is ModeKind.MERGED:
            return False
        dedicated = self.switcher.holds.dedicated
        if dedicated is not None:
            return dedicated != ref
        return self._decide(ref, None).action in (Action.UNMERGE, Action.SWITCH)

    def _follow(self, ref: str) -> None:
        """Merge ``ref`` (the fleet dedicated this engine to it), unmerging another first."""
        merged = self.switcher.merged_revision
        if merged == ref:
            return
        if merged is not None:
            self._record(self.switcher.unmerge())
        if self._mergeable(ref):
            self._ask(ref)

    def _mergeable(self, ref: str) -> bool:
        """Seen in a step (its key is known) and its merge never refused (``ModeSwitcher``)."""
        return ref in self._keys and ref not in self.switcher.refused

    def close(self) -> None:
        """Unmerge (the base weights come back), abandon a staging, drop a pending lease."""
        self._stop_timing()
        if self._pending is not None:
            self._pending.add_done_callback(_release_if_granted)
            self._pending = None
        self.switcher.abandon()
        self.report = replace(self.report, staging_revision=None)
        if self.switcher.merged_revision is not None:
            self._record(self.switcher.unmerge())

    def payer(self, ref: str) -> str | None:
        """The tenant whose requests carried most of ``ref``'s tokens in the window (ties: the
        first name); None when none are known."""
        prefix = payer_label(ref, "")
        for label, _ in self.payers.share(self.clock.now()).shares:
            if label.startswith(prefix):
                return label[len(prefix) :]
        return None

    def _ask(self, ref: str, requester: str | None = None) -> None:
        """Asks for the lease to merge ``ref`` on; ``requester`` is the tenant a load it starts
        is charged to (None: the owner). Only the owner's ask moves a copy's charge
        (``TieredAdapterCache.acquire_future``)."""
        key = self._keys[ref]
        self._pending = self.cache.acquire_future(key, requester=requester)
        self._pending_ref = ref
        self._finish_pending()

    def _finish_pending(self) -> None:
        future, ref = self._pending, self._pending_ref
        if future is None or ref is None or not future.done():
            return
        self._pending = self._pending_ref = None
        if future.exception() is not None:  # no slot now: asked again at a later decision
            return
        # False: held (asked again later) or refused before (never again)
        if self.switcher.begin(ref, future.result()):
            self._stage(ref)  # the first piece now: a small model's merge commits at once

    def _record(self, transition: Transition) -> None:
        self.transitions.append(transition)
        self._last_s = self.clock.now()
        merged = self.switcher.merged_revision
        kind, seconds = transition.kind.value, transition.seconds
        self.report = self.report.observed(kind, seconds, merged, transition.staging_s)

    def _transition_s(self) -> float:
        """What one transition costs the steps: its stall and its staging both run on the
        engine's thread between steps (the staging only spread over more boundaries)."""
        if not self.transitions:
            return TRANSITION_PRIOR_S
        return statistics.median(t.cost_s for t in self.transitions)


def payer_label(ref: str, tenant: str) -> str:
    """``ModeController.payers``' label for ``tenant``'s tokens of ``ref`` (a newline never is
    in a ref)."""
    return f"{ref}\n{tenant}"


def _release_if_granted(future: Future[Lease]) -> None:
    if future.exception() is None:
        future.result().release()
