"""Merge and unmerge between steps: the one writer of the runner's LoRA applier.

A merge holds a cache lease on the merged revision, so its slot cannot be evicted or refilled
while its delta is in the base weights; the lease is released only after the unmerge. Both
transitions run under the runner's slot lock, so no forward ever sees half-merged weights, and
the time each takes (device work included) is measured with the injected clock and reported.
A revision whose merge is refused (``MergeRefusedError``: its delta would swamp the base weights)
changes nothing, is remembered (``refused``) and never asked again: it stays served unmerged.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from loraplex.clock import Clock
from loraplex.engine.merge_holds import MergeHolds
from loraplex.engine.runner import ModelRunner
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
from loraplex.residency.cache.jobs import Lease

_log = logging.getLogger(__name__)


class TransitionKind(enum.Enum):
    MERGE = "merge"
    UNMERGE = "unmerge"


@dataclass(frozen=True)
class Transition:
    """One measured transition (exported as ``loraplex_mode_transition_seconds``)."""

    kind: TransitionKind  # merge or unmerge
    revision: str  # the adapter ref merged or unmerged
    seconds: float  # wall time of the transition, device work included


class ModeSwitcher:
    """Folds one leased revision into ``runner``'s model, and back out, between steps."""

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
        self._merger = WeightMerger(runner.model)
        self._negative = negative_pool_for(pool)
        self._lease: Lease | None = None
        self._revision: str | None = None
        # revision ref -> why its merge was refused; bounded by the revisions this engine served
        self.refused: dict[str, str] = {}

    @property
    def merged_revision(self) -> str | None:
        """The adapter ref in the base weights; None when unmerged."""
        return self._revision

    def is_pinned(self, revision: str) -> bool:
        """True while ``revision`` is merged: it cannot be evicted, deprecated or rolled back."""
        return self._revision == revision

    def merge(self, revision: str, lease: Lease) -> Transition | None:
        """Merge the adapter ``lease`` holds; the switcher keeps the lease until unmerged.
        None (the lease released, nothing changed) while an admin action holds ``revision``, and
        when its merge is refused (now, or before: ``refused``)."""
        if self._lease is not None:
            lease.release()
            raise MergeStateError(
                f"{revision} cannot be merged: {self._revision} is merged; expected an unmerge"
            )
        if revision in self.refused:
            lease.release()
            return None
        try:
            transition = self.holds.merge_if_free(revision, lambda: self._merge(revision, lease))
        except MergeRefusedError as exc:
            lease.release()
            self.refused[revision] = str(exc)
            _log.warning("mode transition: merge %s refused: %s", revision, exc)
            return None
        if transition is None:
            lease.release()
            _log.info("mode transition: merge %s refused: an admin action holds it", revision)
        return transition

    def _merge(self, revision: str, lease: Lease) -> Transition:
        with self.runner.slot_lock:
            start = self.clock.now()
            weights = slot_weights(self.pool, lease.slot)
            self._negative.load(0, negated(weights))
            try:
                self._merger.merge(weights)
            except MergeRefusedError:
                self._negative.clear(0)
                raise
            self.runner.lora = MergedLoraApplier(self.pool, lease.slot, self._negative)
            seconds = self._finish(start)
        self._lease, self._revision = lease, revision
        return self._report(Transition(TransitionKind.MERGE, revision, seconds))

    def unmerge(self) -> Transition:
        """Restore the base weights and the plain pool; then release the merged lease."""
        lease, revision = self._lease, self._revision
        if lease is None or revision is None:
            raise MergeStateError("nothing is merged; expected a merge before an unmerge")
        with self.runner.slot_lock:
            start = self.clock.now()
            self._merger.unmerge()
            self.runner.lora = self.pool
            self._negative.clear(0)
            seconds = self._finish(start)
        self._lease = self._revision = None
        self.holds.unmerged()
        lease.release()
        return self._report(Transition(TransitionKind.UNMERGE, revision, seconds))

    def _finish(self, start: float) -> float:
        if self.pool.device.type == "cuda":
            torch.cuda.synchronize(self.pool.device)
        return self.clock.now() - start

    def _report(self, transition: Transition) -> Transition:
        _log.info(
            "mode transition: %s %s in %.1f ms",
            transition.kind.value,
            transition.revision,
            transition.seconds * 1000,
        )
        self.on_transition(transition)
        return transition
