"""The adapter cache's load pipeline in the simulator: no bytes move, each stage costs what the
cost model's links say (``cost_model.Link.seconds``), and the real cache decides everything else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from loraplex.artifacts.identity import AdapterKey
from loraplex.residency.ledger import Tier
from loraplex.residency.pipeline import (
    CancelToken,
    Footprint,
    Move,
    Prepared,
    RecoveredCopy,
    Resolved,
)
from loraplex.residency.stats import Stage
from loraplex.sim.cost_model import CostModel


class CostModelPipeline:
    """A ``LoadPipeline`` charging L3->L2 (fetch, verify, commit), L2->L1 (read, parse) and
    L1->L0 (host-to-device copy) their link's fixed seconds plus bytes over bandwidth; the first
    two ``load_busy_scale`` times that when ``busy`` says the engine has requests running as the
    stage starts; the copy, with ``copy_waits_for_step``, also the seconds ``lock_wait`` says the
    step in flight has left; the first L3 -> L2 stage also ``first_load_s`` (``cost_model``'s
    docstring)."""

    # True (an empty L1 -> L0 phase, as the real cache ran it before): the recorded results
    # depend on the order of same-time events
    prepares_l0 = True

    def __init__(
        self,
        footprints: Mapping[AdapterKey, Footprint],
        cost: CostModel,
        on_charge: Callable[[float], None] | None = None,
        scale: float = 1.0,
        *,
        busy: Callable[[], bool] | None = None,
        lock_wait: Callable[[], float] | None = None,
    ) -> None:
        self._footprints = footprints
        self._links = cost.links
        self._scale = scale  # a fleet replica's CPU scale (``CostModel.fleet_cpu_scale``)
        self._on_charge = on_charge  # told each stage's seconds (the engine's shared CPU)
        # whether the engine has requests running, read when a stage before the copy starts;
        # None: the file prices no slowdown (``load_busy_scale`` 1)
        self._busy = None if cost.load_busy_scale == 1.0 else busy
        self._busy_scale = cost.load_busy_scale
        # seconds until the step in flight ends, read when a copy into a slot starts (it waits
        # for the slot lock the forward holds); None: the file has no ``copy_waits_for_step``
        self._lock_wait = lock_wait if cost.copy_waits_for_step else None
        # a fresh process's one-time work, charged to its first fetch and then spent
        self._first_load_s = cost.first_load_s

    def _charge(self, stage: Stage, link: str, nbytes: int) -> dict[Stage, float]:
        seconds = self._links[link].seconds(nbytes)
        if self._scale != 1.0:
            seconds *= self._scale
        first = 0.0
        if stage is Stage.FETCH and self._first_load_s:
            first, self._first_load_s = self._first_load_s, 0.0
        if self._on_charge is not None:
            self._on_charge(seconds + first)  # the CPU the load takes from a step: its own price
        if stage is Stage.COPY:
            if self._lock_wait is not None:  # the real stage counter times the wait too
                seconds += self._lock_wait()
        elif self._busy is not None and self._busy():
            seconds *= self._busy_scale
        return {stage: seconds + first}

    def resolve(self, key: AdapterKey, cancel: CancelToken) -> Resolved:
        cancel.check(Stage.RESOLVE)
        return Resolved(self._footprints[key], {Stage.RESOLVE: 0.0})

    def prepare(self, move: Move, cancel: CancelToken) -> Prepared:
        fp = self._footprints[move.key]
        if move.target is Tier.L2:
            cancel.check(Stage.FETCH)
            return Prepared(None, self._charge(Stage.FETCH, "L3_to_L2", fp.disk_bytes))
        if move.target is Tier.L1:
            cancel.check(Stage.READ)
            return Prepared(None, self._charge(Stage.READ, "L2_to_L1", fp.disk_bytes))
        return Prepared(None, {})

    def install(
        self, move: Move, prepared: Prepared, slot: int | None, cancel: CancelToken
    ) -> dict[Stage, float]:
        if move.target is Tier.L0:
            cancel.check(Stage.COPY)
            return self._charge(Stage.COPY, "L1_to_L0", self._footprints[move.key].memory_bytes)
        return {}

    def discard(self, move: Move, prepared: Prepared) -> None:
        return None

    def drop(self, tier: Tier, key: AdapterKey, slot: int | None) -> None:
        return None

    def recover(self) -> list[RecoveredCopy]:
        return []
