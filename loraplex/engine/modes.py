"""Merge and unmerge between steps: the one writer of the runner's LoRA applier.

A merge holds a cache lease on the merged revision, so its slot cannot be evicted or refilled
while its delta is in the base weights (or being staged); the lease is released only after the
unmerge, or when a staging is abandoned. On a CPU a merge is staged: its merged weights are
built beside the live ones a budgeted piece per step boundary (model/staged_merge.py), then one
boundary commits them by reference; elsewhere the commit writes them in place. Commits and
unmerges run under the runner's slot lock, so no forward ever sees half-merged weights, and the
time each takes (device work included: what the steps waited) is measured with the injected
clock and reported, a merge's staging time beside it.
A revision whose merge is refused (``MergeRefusedError``: its delta would swamp the base weights)
changes nothing, is remembered (``refused``) and never asked again: it stays served unmerged.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from loraplex.clock import Clock
from loraplex.engine.merge_holds import MergeHolds
from loraplex.engine.runner import ModelRunner
from loraplex.model.adapter_weights import AdapterWeights
from loraplex.model.buffers import ARENA_RELEASE_BYTES
from loraplex.model.lora import LoraSlotPool
from loraplex.model.merge import (
    MergedLoraApplier,
    MergeRefusedError,
    MergeStateError,
    WeightMerger,
    negated,
    negative_pool_for,
    slot_weights,
)
from loraplex.model.staged_merge import MergeStaging
from loraplex.residency.cache.jobs import Lease

_log = logging.getLogger(__name__)


class TransitionKind(enum.Enum):
    MERGE = "merge"
    UNMERGE = "unmerge"


@dataclass(frozen=True)
class Transition:
    """One measured transition (exported as ``loraplex_mode_transition_seconds`` and, for a
    merge's staging, ``loraplex_mode_staging_seconds``)."""

    kind: TransitionKind  # merge or unmerge
    revision: str  # the adapter ref merged or unmerged
    seconds: float  # the stall: wall time of the one boundary's commit, device work included
    staging_s: float = 0.0  # a merge's staging work before the commit (0: none)
    staging_steps: int = 0  # step boundaries the staging was spread over (0: none)

    @property
    def cost_s(self) -> float:
        """All the engine time the transition took from the steps (stall + staging)."""
        return self.seconds + self.staging_s


@dataclass
class _Staging:
    """A merge under way: its lease, and the merged weights built so far."""

    revision: str  # the adapter ref being merged
    lease: Lease  # held until the unmerge, or released when the staging is abandoned
    weights: AdapterWeights  # the adapter read out of its slot at the start
    staging: MergeStaging | None  # None: an in-place merger (everything happens at the commit)
    seconds: float = 0.0  # staging work so far, the start's included


class ModeSwitcher:
    """Folds one leased revision into ``runner``'s model, and back out, between steps.

    A merge begins (:meth:`begin`), is staged a budgeted piece per step boundary (:meth:`advance`,
    the live weights untouched) and commits at the boundary where the last piece is staged; it
    can be abandoned (:meth:`abandon`) until then. :meth:`merge` does all of it at once."""

    def __init__(
        self,
        runner: ModelRunner,
        pool: LoraSlotPool,
        clock: Clock,
        on_transition: Callable[[Transition], None] = lambda _: None,
        holds: MergeHolds | None = None,
    ) -> None:
        self.runner = runner
        self.holds = holds or MergeHolds()  # an admin action's holds: those are never merged
        self.pool = pool
        self.clock = clock
        self.on_transition = on_transition
        self._merger = WeightMerger(runner.model, clock=clock.now)
        self._negative = negative_pool_for(pool)
        self._lease: Lease | None = None
        self._revision: str | None = None
        self._staging: _Staging | None = None
        # revision ref -> why its merge was refused; bounded by the revisions this engine served
        self.refused: dict[str, str] = {}

    @property
    def merged_revision(self) -> str | None:
        """The adapter ref in the base weights; None when unmerged."""
        return self._revision

    @property
    def staging_revision(self) -> str | None:
        """The adapter ref whose merge is under way (still served unmerged); None: none is."""
        return None if self._staging is None else self._staging.revision

    def is_pinned(self, revision: str) -> bool:
        """True while ``revision`` is merged: it cannot be evicted, deprecated or rolled back."""
        return self._revision == revision

    def merge(self, revision: str, lease: Lease) -> Transition | None:
        """Merge the adapter ``lease`` holds, all at once; the switcher keeps the lease until
        unmerged. None (the lease released, nothing changed) while an admin action holds
        ``revision``, and when its merge is refused (now, or before: ``refused``)."""
        if not self.begin(revision, lease):
            return None
        return self.advance(math.inf)

    def begin(self, revision: str, lease: Lease) -> bool:
        """Start merging the adapter ``lease`` holds (nothing live changes); False (the lease
        released) when ``revision`` is held or its merge was refused before."""
        if self._lease is not None or self._staging is not None:
            lease.release()
            busy = self._revision or self.staging_revision
            raise MergeStateError(
                f"{revision} cannot be merged: {busy} is merged or staged; expected an unmerge"
            )
        if revision in self.refused:
            lease.release()
            return False
        if self.holds.is_held(revision):
            lease.release()
            _log.info("mode transition: merge %s refused: an admin action holds it", revision)
            return False
        start = self.clock.now()
        weights = slot_weights(self.pool, lease.slot)
        self._negative.load(0, negated(weights))  # read by no step until the commit
        staging = self._merger.stage(weights) if self._merger.staged else None
        self._staging = _Staging(revision, lease, weights, staging, self.clock.now() - start)
        return True

    def advance(self, budget_s: float) -> Transition | None:
        """Stage the next piece of the merge under way (about ``budget_s`` of work) and commit it
        once all is staged: the Transition then, else None. A refused merge, or one an admin
        action holds at the commit, is abandoned (None, nothing live changed)."""
        current = self._staging
        if current is None:
            raise MergeStateError("no merge is under way; expected begin() first")
        if current.staging is not None and not current.staging.done:
            start = self.clock.now()
            try:
                current.staging.advance(budget_s)
            except MergeRefusedError as exc:
                self.refused[current.revision] = str(exc)
                _log.warning("mode transition: merge %s refused: %s", current.revision, exc)
                self.abandon()
                return None
            finally:
                current.seconds += self.clock.now() - start
            if not current.staging.done:
                return None
        try:
            transition = self.holds.merge_if_free(current.revision, lambda: self._commit(current))
        except MergeRefusedError as exc:  # an in-place merger checks at the commit
            self.refused[current.revision] = str(exc)
            _log.warning("mode transition: merge %s refused: %s", current.revision, exc)
            self.abandon()
            return None
        if transition is None:
            _log.info("mode transition: merge %s held by an admin action", current.revision)
            self.abandon()
            return None
        return self._report(transition)

    def abandon(self) -> None:
        """Drop the merge under way (its staged weights, the negative copy) and release its
        lease; nothing live changed. A no-op when none is."""
        current, self._staging = self._staging, None
        if current is None:
            return
        if current.staging is not None:
            current.staging.abandon()
        self._negative.clear(0)
        current.lease.release()

    def _commit(self, current: _Staging) -> Transition:
        with self.runner.slot_lock:
            start = self.clock.now()
            if current.staging is None:
                self._merger.merge(current.weights)
            else:
                self._merger.commit(current.staging)
            self.runner.lora = MergedLoraApplier(self.pool, current.lease.slot, self._negative)
            seconds = self._finish(start)
        self._lease, self._revision, self._staging = current.lease, current.revision, None
        steps = 0 if current.staging is None else current.staging.num_calls
        return Transition(TransitionKind.MERGE, current.revision, seconds, current.seconds, steps)

    def unmerge(self) -> Transition:
        """Restore the base weights and the plain pool; then release the merged lease."""
        lease, revision = self._lease, self._revision
        if lease is None or revision is None:
            raise MergeStateError("nothing is merged; expected a merge before an unmerge")
        with self.runner.slot_lock:
            start = self.clock.now()
            self._merger.unmerge(release_now=False)  # freed by pieces: ``release_step``
            self.runner.lora = self.pool
            self._negative.clear(0)
            seconds = self._finish(start)
        self._lease = self._revision = None
        self.holds.unmerged()
        lease.release()
        return self._report(Transition(TransitionKind.UNMERGE, revision, seconds))

    def release_step(self) -> int:
        """Free the next ``ARENA_RELEASE_BYTES`` of the arenas of merged weights an unmerge or
        an abandon dropped (the caller is between steps); the bytes freed."""
        return self._merger.releases.step(ARENA_RELEASE_BYTES)

    def _finish(self, start: float) -> float:
        if self.pool.device.type == "cuda":
            torch.cuda.synchronize(self.pool.device)
        return self.clock.now() - start

    def _report(self, transition: Transition) -> Transition:
        _log.info(
            "mode transition: %s %s: steps waited %.1f ms (staging %.1f ms over %d boundaries)",
            transition.kind.value,
            transition.revision,
            transition.seconds * 1000,
            transition.staging_s * 1000,
            transition.staging_steps,
        )
        self.on_transition(transition)
        return transition
