"""A load pipeline that moves no bytes: each stage reports the duration a cost model gives it.

Torch-free. With ``SimExecutor`` it runs the real cache in simulated time (the replay, the
simulator, the tests): every decision is the cache's own, only the I/O is modelled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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


@dataclass(frozen=True)
class StageCosts:
    """Per-stage costs: fixed seconds plus bytes over a bandwidth (from measurements)."""

    resolve_s: float = 0.0005  # key -> location
    fetch_bytes_per_s: float = 1e8  # L3 -> quarantine
    verify_bytes_per_s: float = 1e9  # digest + tensor validation
    commit_s: float = 0.0002  # rename into L2
    read_bytes_per_s: float = 5e8  # L2 -> L1 parse
    copy_bytes_per_s: float = 5e9  # L1 -> L0
    per_move_s: float = 0.0005  # fixed overhead of every move


class SimulatedPipeline:
    """A LoadPipeline that moves no bytes and reports each stage's modelled duration."""

    # True (an empty L1 -> L0 phase, as the real cache ran it before): the recorded results
    # depend on the order of same-time events
    prepares_l0 = True

    def __init__(self, footprints: Mapping[AdapterKey, Footprint], costs: StageCosts) -> None:
        self.footprints = footprints
        self.costs = costs

    def resolve(self, key: AdapterKey, cancel: CancelToken) -> Resolved:
        cancel.check(Stage.RESOLVE)
        return Resolved(self.footprints[key], {Stage.RESOLVE: self.costs.resolve_s})

    def prepare(self, move: Move, cancel: CancelToken) -> Prepared:
        c, fp = self.costs, self.footprints[move.key]
        if move.target is Tier.L2:
            cancel.check(Stage.FETCH)
            fetch = c.per_move_s + fp.disk_bytes / c.fetch_bytes_per_s
            return Prepared(
                None, {Stage.FETCH: fetch, Stage.VERIFY: fp.disk_bytes / c.verify_bytes_per_s}
            )
        if move.target is Tier.L1:
            cancel.check(Stage.READ)
            return Prepared(None, {Stage.READ: c.per_move_s + fp.disk_bytes / c.read_bytes_per_s})
        return Prepared(None, {})

    def install(
        self, move: Move, prepared: Prepared, slot: int | None, cancel: CancelToken
    ) -> dict[Stage, float]:
        c, fp = self.costs, self.footprints[move.key]
        if move.target is Tier.L2:
            return {Stage.COMMIT: c.commit_s}
        if move.target is Tier.L0:
            cancel.check(Stage.COPY)
            return {Stage.COPY: c.per_move_s + fp.memory_bytes / c.copy_bytes_per_s}
        return {}

    def discard(self, move: Move, prepared: Prepared) -> None:
        return None

    def drop(self, tier: Tier, key: AdapterKey, slot: int | None) -> None:
        return None

    def recover(self) -> list[RecoveredCopy]:
        return []
