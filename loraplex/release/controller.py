"""``ReleaseController``: moves every release forward, one cheap ``tick`` at a time.

The serving process calls ``tick`` every ~0.25 s. A tick reads the releases that need work (one
query; nothing else when none does), starts or checks the environment's work (prewarm, probes:
futures, never waited on), reads each canary's live traffic and judges it. Every transition is
a compare-and-set (``store.transition``): an operator who moved the release first wins and the
controller re-reads at its next tick.

A canary step that has not passed after ``plan.effective_max_step_s`` (``Thresholds.max_step_s``)
is rolled back as "not enough traffic to judge": a share nobody calls proves nothing, and
waiting forever would hold two revisions resident with no end.

Restart: a new controller on the same database resumes every release from its persisted state.
Prewarming and probing redo their work (both idempotent); a canary restarts its current step's
dwell, since live-traffic windows lived in the old process's memory; finished releases whose
hold window is still open get their baseline pinned again.

NOTE: ``clock`` must count epoch seconds (``WallClock``): ``hold_until`` is persisted and read by
other processes, and operators' commands stamp it with the registry's wall clock. The server
records live traffic (``ReleaseEnv.window``) on the same clock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from loraplex.artifacts.identity import AdapterKey
from loraplex.clock import Clock
from loraplex.registry import Registry
from loraplex.release import compare, probes
from loraplex.release.env import ReleaseEnv
from loraplex.release.errors import ReleaseConflictError
from loraplex.release.model import MAX_PLAN_SECONDS, Release, ReleaseState, RevisionWindow
from loraplex.release.store import ReleaseStore

S = ReleaseState
log = logging.getLogger(__name__)


class WallClock:
    """Epoch seconds (``time.time``): the clock a serving controller runs on."""

    def now(self) -> float:
        return time.time()


@dataclass
class _Job:
    """What this process knows of one release in flight (lost on restart, redone then)."""

    candidate: AdapterKey
    baseline: AdapterKey
    prewarm: Future[None] | None = None
    probes: probes.ProbeRun | None = None
    anchored_step: int | None = None  # the canary step whose start this process set
    step_started_at: float = 0.0
    observed_at: float = float("-inf")  # last comparison written


@dataclass
class _Pins:
    """Which releases need which revision pinned: ``env.hold`` is not counted, so a revision
    is unheld only when no release of this controller still needs it."""

    env: ReleaseEnv
    owners: dict[AdapterKey, set[str]] = field(default_factory=dict)

    def hold(self, key: AdapterKey, owner: str, *, pinned: bool = False) -> None:
        """``pinned``: already pinned by a prewarm; only record the owner."""
        first = key not in self.owners
        self.owners.setdefault(key, set()).add(owner)
        if first and not pinned:
            self.env.hold(key)

    def release(self, key: AdapterKey, owner: str) -> None:
        holders = self.owners.get(key, set())
        holders.discard(owner)
        if not holders:
            self.owners.pop(key, None)
            self.env.unhold(key)


class ReleaseController:
    def __init__(
        self,
        registry: Registry,
        env: ReleaseEnv,
        clock: Clock,
        *,
        actor: str = "release-controller",
        observe_every_s: float = 1.0,
        on_move: Callable[[ReleaseState, str], None] | None = None,
    ) -> None:
        self._registry = registry
        self._store = ReleaseStore(registry)
        self._env = env
        self._clock = clock
        self._actor = actor  # written to the audit rows of the controller's transitions
        self._observe_every_s = observe_every_s  # comparison writes per release, at most
        self._on_move = on_move  # told each state a release moved into, and its id (metrics)
        # the state each release needing work was last seen in (by this controller's reads or
        # moves): a different state read later was an operator's move (CLI, admin API, another
        # process), reported to ``on_move`` too. NOTE: only the controller's own moves were, so
        # `loraplex release rollback` raised no LoraplexReleaseRolledBack (newop4).
        self._seen: dict[str, ReleaseState] = {}
        self._jobs: dict[str, _Job] = {}
        self._pins = _Pins(env)
        self._settled: set[str] = set()  # finished releases whose candidate pin was dropped
        self._holding: set[str] = set()  # finished releases whose baseline this process holds
        self._keys: dict[str, AdapterKey] = {}  # revision ref -> key (revisions are immutable)

    @property
    def store(self) -> ReleaseStore:
        return self._store

    def tick(self) -> None:
        """Advance every release one step; never raises (a failure is logged, and the next
        tick tries again from what the database says)."""
        try:
            work = self._store.needing_work()
        except Exception:
            log.exception("release controller: cannot read releases")
            return
        now = self._clock.now()
        try:
            self._report_moves_of_others(work)
        except Exception:
            log.exception("release controller: cannot report the moves of others")
        for release in work:
            try:
                if release.terminal:
                    self._settle(release, now)
                else:
                    self._advance(release, now)
            except ReleaseConflictError as exc:
                log.info("release controller: %s; re-reading", exc)
                self._jobs.pop(release.release_id, None)
            except Exception:
                log.exception("release controller: release %s failed a tick", release.release_id)
        active = {r.release_id for r in work if not r.terminal}
        for gone in set(self._jobs) - active:
            del self._jobs[gone]

    def _report_moves_of_others(self, work: list[Release]) -> None:
        """Reports to ``on_move`` each release seen in one state before and in another now, a
        move this controller did not make; one that left the work list (a terminal release with
        no hold) is read once to see where it went."""
        now_in = {release.release_id: release.state for release in work}
        for gone in set(self._seen) - set(now_in):
            try:
                release = self._store.get_release(gone)
            except Exception:  # deleted or unreadable: nothing to report
                log.debug("release controller: release %s not read", gone, exc_info=True)
                continue
            now_in[gone] = release.state
        for release_id, state in now_in.items():
            before = self._seen.get(release_id)
            if before is not None and before is not state and self._on_move is not None:
                self._on_move(state, release_id)
        self._seen = {r.release_id: r.state for r in work}

    # --- releases in flight --------------------------------------------------------------------

    def _advance(self, release: Release, now: float) -> None:
        if release.state is S.STAGED:
            self._move(release, S.PREWARMING, now)
            return
        job = self._job(release)
        loaded = self._prewarmed(release, job)
        if loaded is None:
            return
        if loaded:
            self._move(release, S.ABORTED, now, reason=f"candidate failed to load: {loaded}")
        elif release.state is S.PREWARMING:
            self._move(release, S.PROBING, now)
        elif release.state is S.PROBING:
            self._probe(release, job, now)
        elif release.state is S.CANARY:
            self._observe(release, job, now)

    def _job(self, release: Release) -> _Job:
        job = self._jobs.get(release.release_id)
        if job is None:
            job = _Job(self._key(release.candidate_ref), self._key(release.baseline_ref))
            self._pins.hold(job.baseline, release.release_id)
            self._jobs[release.release_id] = job
        return job

    def _prewarmed(self, release: Release, job: _Job) -> str | None:
        """None while loading; "" once loaded; the load error's text if it failed."""
        if job.prewarm is None:
            job.prewarm = probes.called(
                lambda: self._env.prewarm(job.candidate, gpu=release.plan.gpu)
            )
            self._pins.hold(job.candidate, release.release_id, pinned=True)
        if not job.prewarm.done():
            return None
        error = job.prewarm.exception()
        return "" if error is None else str(error) or type(error).__name__

    def _probe(self, release: Release, job: _Job, now: float) -> None:
        if job.probes is None:
            revision = self._registry.get_revision(release.candidate_ref)
            try:
                cases = probes.probe_cases(revision, release.plan.probes)
            except ValueError as exc:  # a probe stored before registration checked it
                self._move(release, S.ABORTED, now, reason=f"candidate's probe is invalid: {exc}")
                return
            job.probes = probes.launch(
                self._env, cases, release.tenant, job.candidate, job.baseline
            )
        if not job.probes.done():
            return
        failure = probes.first_failure(job.probes)
        if failure is not None:
            self._move(release, S.ROLLED_BACK, now, reason=failure)
            return
        self._move(release, S.CANARY, now, step=0, step_started_at=now, comparison=None)
        job.anchored_step, job.step_started_at = 0, now

    def _observe(self, release: Release, job: _Job, now: float) -> None:
        if job.anchored_step != release.step:
            # Resumed: the old process's traffic windows are gone, so the step starts over.
            saved = self._store.save_observation(release, step_started_at=now)
            if (saved.state, saved.version) != (release.state, release.version):
                return  # moved by someone else meanwhile: the next tick sees where it is
            release = saved
            job.anchored_step, job.step_started_at = release.step, now
        since = job.step_started_at
        cand = self._env.window(release.release_id, release.candidate_ref, since)
        stable = self._env.window(release.release_id, release.baseline_ref, since)
        dwelt = now - since >= release.plan.dwell_s
        judged = compare.judge(
            release.step, now, cand, stable, limits=release.plan.thresholds, dwelt=dwelt
        )
        if judged.breaches:
            reason = "; ".join(judged.breaches)
            self._move(release, S.ROLLED_BACK, now, reason=reason, comparison=judged)
        elif judged.passed and release.step + 1 < len(release.plan.ladder):
            step = release.step + 1
            self._move(release, S.CANARY, now, step=step, step_started_at=now, comparison=judged)
            job.anchored_step, job.step_started_at = step, now
        elif judged.passed and release.plan.auto_promote:
            self._move(release, S.PROMOTED, now, reason="every step passed", comparison=judged)
        elif not judged.passed and now - since >= release.plan.effective_max_step_s:
            reason = _starved(release, cand, now - since)
            self._move(release, S.ROLLED_BACK, now, reason=reason, comparison=judged)
        elif now - job.observed_at >= self._observe_every_s:
            self._store.save_observation(release, comparison=judged)
            job.observed_at = now

    def _move(self, release: Release, to: ReleaseState, now: float, **changes: object) -> Release:
        moved = self._store.transition(release, to, actor=self._actor, now=now, **changes)
        log.info("release %s: %s -> %s", release.release_id, release.state.value, to.value)
        self._seen[release.release_id] = to
        if self._on_move is not None:
            self._on_move(to, release.release_id)
        if moved.terminal:
            self._jobs.pop(release.release_id, None)
        return moved

    def _key(self, ref: str) -> AdapterKey:
        key = self._keys.get(ref)
        if key is None:
            key = self._keys[ref] = self._registry.get_revision(ref).key()
        return key

    # --- finished releases ---------------------------------------------------------------------

    def _settle(self, release: Release, now: float) -> None:
        """Drop the candidate's pins once; hold the baseline until ``hold_until``, then unpin
        it and clear the hold (delayed eviction). The revision the alias left (the baseline
        when promoted, the candidate otherwise) is released only once it is not merged into
        the engine's weights (docs/modes.md): until then every tick looks again."""
        owner = release.release_id
        baseline = self._key(release.baseline_ref)
        candidate = self._key(release.candidate_ref)
        promoted = release.state is S.PROMOTED
        if owner not in self._settled:
            if not promoted and self._env.is_merged(candidate):
                return  # the hold below is not cleared either, so ticks keep coming
            self._pins.release(candidate, owner)
            self._settled.add(owner)
        hold_until = release.hold_until
        longest = release.updated_at + MAX_PLAN_SECONDS
        if hold_until is not None and not hold_until <= longest:
            # NOTE: a release stored before ``MAX_PLAN_SECONDS`` (a ``window_s`` of ``inf`` or
            # ``1e300``) held its baseline pinned for good: no hold outlives the longest window
            # a plan may have now, counted from the release's last change
            hold_until = longest
        if hold_until is not None and now < hold_until:
            if owner not in self._holding:
                self._pins.hold(baseline, owner)
                self._holding.add(owner)
            return
        if promoted and self._env.is_merged(baseline):
            return
        self._store.release_hold(release, actor=self._actor, now=now)
        self._pins.release(baseline, owner)
        self._holding.discard(owner)


def _starved(release: Release, candidate: RevisionWindow, waited_s: float) -> str:
    """Why a step that waited ``max_step_s`` without enough evidence is rolled back."""
    counted = candidate.without_top_callers().requests
    limits = release.plan.thresholds
    return (
        f"{compare.NOT_ENOUGH_TRAFFIC}: step {release.step + 1} saw {counted} counted candidate "
        f"requests in {waited_s:.0f} s (min_requests {limits.min_requests}, "
        f"max_step_s {release.plan.effective_max_step_s:g})"
    )
