"""The load pipeline seam: the typed steps the cache drives and the protocol that performs them.

Torch-free. The cache decides *what* moves (tier order, room, victims); a ``LoadPipeline``
performs each move in two off-lock phases around the cache's placement decision:

    resolve(key)                      -> Resolved     (artifact location and per-tier sizes)
    prepare(move)                     -> Prepared     (L3->L2: fetch into quarantine + verify;
                                                       L2->L1: read + parse; L1->L0: nothing)
    -- cache takes room in move.target, dropping victims (never before prepare succeeded) --
    install(move, prepared, slot)     -> stage times  (L2: atomic rename; L1: keep the tensors;
                                                       L0: copy into the slot)
    discard(move, prepared)           undoes a prepare (temporary files, staged memory)
    drop(tier, key, slot)             removes an installed copy (eviction, or undo of install)
    recover()                         verified L2 copies that survived a restart (at start)

Implementations: ``loraplex.runtime.tier_backends.TierPipeline`` (real tiers) and
``loraplex.residency.simulated.SimulatedPipeline`` (modelled costs, no bytes). ``drop`` and
``discard`` run after the cache's lock is released (they may block on I/O or the slot lock).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from loraplex.artifacts.identity import AdapterKey
from loraplex.errors import LoadCancelledError
from loraplex.residency.ledger import Tier
from loraplex.residency.stats import Stage


@dataclass(frozen=True)
class Footprint:
    """Bytes one adapter costs in each cached tier."""

    slot_bytes: int  # L0: the slot pool's bytes per slot
    memory_bytes: int  # L1: CPU tensors in the serving dtype
    disk_bytes: int  # L2: the verified files on disk

    def __post_init__(self) -> None:
        for name in ("slot_bytes", "memory_bytes", "disk_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 0")

    def bytes_in(self, tier: Tier) -> int:
        if tier == Tier.L0:
            return self.slot_bytes
        return self.memory_bytes if tier == Tier.L1 else self.disk_bytes


@dataclass(frozen=True)
class Move:
    """One fill of ``target`` from the copy in ``source`` (the next faster tier)."""

    key: AdapterKey  # the adapter revision
    source: Tier  # where the bytes come from
    target: Tier  # where they go


@dataclass(frozen=True)
class Resolved:
    """Result of the resolve stage."""

    footprint: Footprint  # per-tier sizes
    seconds: dict[Stage, float]  # stage durations


@dataclass(frozen=True)
class Prepared:
    """A move's staged bytes, outside every tier budget until installed."""

    payload: object  # implementation-defined (a quarantine path, CPU tensors, None)
    seconds: dict[Stage, float]  # stage durations


@dataclass(frozen=True)
class RecoveredCopy:
    """A verified copy a previous process left in a persistent tier, found at start."""

    key: AdapterKey  # the adapter revision it holds
    size_bytes: int  # bytes it occupies in the tier
    age_s: float  # seconds since it was committed (older copies are evicted first)


class CancelToken:
    """Set when every waiter of a load gave up; checked by the pipeline between stages."""

    # NOTE: a plain flag, not a threading.Event: nothing waits on it, and a load creates one
    # (an Event is a Condition and two locks). Setting and reading a bool is atomic under the GIL.
    def __init__(self) -> None:
        self._cancelled = False

    def cancel(self) -> None:
        self._cancelled = True

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def check(self, stage: Stage) -> None:
        if self._cancelled:
            raise LoadCancelledError(f"load cancelled before stage {stage.value}")


class LoadPipeline(Protocol):
    """Performs the cache's moves. Every method may raise a domain error; none takes the lock."""

    # False: ``prepare`` of a move into L0 stages nothing (it would return ``Prepared(None,
    # {})``), so the cache places such a move at once instead of running an empty phase (one
    # executor hop less per L1 -> L0 load: a thread hand-off with the real executor).
    prepares_l0: bool

    def resolve(self, key: AdapterKey, cancel: CancelToken) -> Resolved: ...

    def prepare(self, move: Move, cancel: CancelToken) -> Prepared: ...

    def install(
        self, move: Move, prepared: Prepared, slot: int | None, cancel: CancelToken
    ) -> dict[Stage, float]:
        """Completes ``move``. An L0 install may find ``slot`` still holding the copy the cache
        evicted to make room for it (that copy's drop is skipped): it replaces it."""
        ...

    def discard(self, move: Move, prepared: Prepared) -> None: ...

    def drop(self, tier: Tier, key: AdapterKey, slot: int | None) -> None:
        """Removes ``key``'s bytes from ``tier``; for L0, clears ``slot`` whatever it holds
        (a reservation dropped before its install clears the replaced copy left there)."""
        ...

    def recover(self) -> list[RecoveredCopy]:
        """Verified L2 copies kept from before a restart ([] when nothing persists)."""
        ...


@dataclass(frozen=True)
class LoadResult:
    """How a lease's adapter got into L0."""

    key: AdapterKey  # the adapter revision
    source: Tier  # the tier it came from (L0: it was already resident)
    seconds: dict[Stage, float]  # per-stage durations of the load (empty on an L0 hit)
    room_wait_s: float = 0.0  # seconds its moves waited for room (not a pipeline stage)

    @property
    def total_s(self) -> float:
        """Seconds from the load's start to its lease: the stages plus the waits for room."""
        return sum(self.seconds.values()) + self.room_wait_s
