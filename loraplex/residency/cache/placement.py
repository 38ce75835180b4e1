"""Where a prepared load goes: one pure decision over the tier's room, then the flow applies it.

Torch-free. ``decide`` reads the room through ``Room`` (lazily: victims are ranked only when the
load does not fit now) and returns what to do; it changes nothing. The whole rule is this table
(``victims``: None when eviction cannot make room, [] when the load fits now):

    too large for the tier's whole budget (or the tenant's cap)    -> Fail(AdapterTooLargeError)
    victims == []                                                  -> Place([])
    optional, victims found, the policy admits displacing them     -> Place(victims)
    optional, victims refused or None                              -> Fail(CapacityError)
    demand with an acquirer, victims found, policy defers s > 0    -> Defer(s)
    demand, victims found (not deferred)                           -> Place(victims)
    demand, no victims, only prefetch/pin waiters, pins fill tier  -> Fail(CapacityError)
    demand, no victims otherwise                                   -> Block

A pin has no deadline, so a pin-only load that could only fit after an operator's unpin would
hold the tenant's load permit forever: it fails. Acquirers block, bounded by their deadlines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from loraplex.errors import AdapterTooLargeError, CapacityError
from loraplex.residency.ledger import ResidentEntry, Tier


@dataclass(frozen=True)
class Demand:
    """The facts about one prepared load that the decision needs."""

    ref: str  # the adapter's name@revision (for messages)
    target: Tier  # the tier it wants room in
    optional: bool  # prefetch/promotion: may be refused, never waits
    has_acquirer: bool  # some waiter wants a lease (bounded by a deadline)


@dataclass(frozen=True)
class Place:
    """Take room now, evicting ``victims`` first."""

    victims: tuple[ResidentEntry, ...]  # most evictable first; empty when it fits


@dataclass(frozen=True)
class Defer:
    """Wait up to ``seconds`` for a cheaper copy to become evictable, then decide again."""

    seconds: float  # the policy's remaining deferral


@dataclass(frozen=True)
class Block:
    """Wait for a release, an unpin or a finished load to free room (or a deadline)."""


@dataclass(frozen=True)
class Fail:
    """End the load with ``error``."""

    error: Exception  # AdapterTooLargeError (permanent) or CapacityError (transient)


Placement = Place | Defer | Block | Fail


class Room(Protocol):
    """What the target tier can offer one load; every answer is read only when needed."""

    def too_large(self) -> AdapterTooLargeError | None:
        """The error when no eviction could ever make room; None otherwise."""
        ...

    def victims(self) -> Sequence[ResidentEntry] | None:
        """[] when the load fits now; the copies to evict; None when they cannot suffice."""
        ...

    def admits(self, victims: Sequence[ResidentEntry]) -> bool:
        """Whether the policy lets an optional load displace ``victims``."""
        ...

    def deferral_s(self, victims: Sequence[ResidentEntry]) -> float:
        """How much longer a demand load should wait rather than displace ``victims``."""
        ...

    def fits_beside_pins(self) -> bool:
        """Whether the load would fit if every unpinned copy were gone."""
        ...


def decide(demand: Demand, room: Room) -> Placement:
    """The placement of one prepared load (the table in this module's docstring)."""
    too_large = room.too_large()
    if too_large is not None:
        return Fail(too_large)
    victims = room.victims()
    if victims is not None and not victims:
        return Place(())
    if demand.optional:
        if victims is not None and room.admits(victims):
            return Place(tuple(victims))
        return Fail(
            CapacityError(f"tier {demand.target.name}: no room for optional load of {demand.ref}")
        )
    if victims is not None:
        wait_s = room.deferral_s(victims) if demand.has_acquirer else 0.0
        return Defer(wait_s) if wait_s > 0 else Place(tuple(victims))
    if not demand.has_acquirer and not room.fits_beside_pins():
        return Fail(
            CapacityError(
                f"tier {demand.target.name}: pinned adapters leave no room for {demand.ref} "
                "(unpin one or raise the budget)"
            )
        )
    return Block()
