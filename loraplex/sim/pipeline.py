"""The adapter cache's load pipeline in the simulator: no bytes move, each stage costs what the
cost model's links say (``cost_model.Link.seconds``), and the real cache decides everything else.
"""

from __future__ import annotations

from collections.abc import Mapping

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
    L1->L0 (host-to-device copy) their link's fixed seconds plus bytes over bandwidth."""

    def __init__(self, footprints: Mapping[AdapterKey, Footprint], cost: CostModel) -> None:
        self._footprints = footprints
        self._links = cost.links

    def resolve(self, key: AdapterKey, cancel: CancelToken) -> Resolved:
        cancel.check(Stage.RESOLVE)
        return Resolved(self._footprints[key], {Stage.RESOLVE: 0.0})

    def prepare(self, move: Move, cancel: CancelToken) -> Prepared:
        fp = self._footprints[move.key]
        if move.target is Tier.L2:
            cancel.check(Stage.FETCH)
            return Prepared(None, {Stage.FETCH: self._links["L3_to_L2"].seconds(fp.disk_bytes)})
        if move.target is Tier.L1:
            cancel.check(Stage.READ)
            return Prepared(None, {Stage.READ: self._links["L2_to_L1"].seconds(fp.disk_bytes)})
        return Prepared(None, {})

    def install(
        self, move: Move, prepared: Prepared, slot: int | None, cancel: CancelToken
    ) -> dict[Stage, float]:
        if move.target is Tier.L0:
            cancel.check(Stage.COPY)
            fp = self._footprints[move.key]
            return {Stage.COPY: self._links["L1_to_L0"].seconds(fp.memory_bytes)}
        return {}

    def discard(self, move: Move, prepared: Prepared) -> None:
        return None

    def drop(self, tier: Tier, key: AdapterKey, slot: int | None) -> None:
        return None

    def recover(self) -> list[RecoveredCopy]:
        return []
