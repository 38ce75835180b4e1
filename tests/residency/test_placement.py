"""The placement decision as a table: one row per rule of ``placement.decide``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from cache_kit import key

from loraplex.errors import AdapterTooLargeError, CapacityError
from loraplex.residency.cache.placement import Block, Defer, Demand, Fail, Place, Placement, decide
from loraplex.residency.ledger import ResidentEntry, Tier

VICTIM = ResidentEntry(key("t", "v"), Tier.L0, 100, 0.0, 0.0, slot=0, ready=True)
TOO_LARGE = AdapterTooLargeError("tier L0: too large")


@dataclass
class TableRoom:
    """A Room answering from the row's values; records which answers were read."""

    too_large_error: AdapterTooLargeError | None = None
    victim_list: tuple[ResidentEntry, ...] | None = ()
    policy_admits: bool = True
    defer_s: float = 0.0
    beside_pins: bool = True
    asked: list[str] | None = None

    def _ask(self, what: str) -> None:
        self.asked = [*(self.asked or []), what]

    def too_large(self) -> AdapterTooLargeError | None:
        return self.too_large_error

    def victims(self) -> Sequence[ResidentEntry] | None:
        self._ask("victims")
        return self.victim_list

    def admits(self, victims: Sequence[ResidentEntry]) -> bool:
        self._ask("admits")
        return self.policy_admits

    def deferral_s(self, victims: Sequence[ResidentEntry]) -> float:
        self._ask("deferral")
        return self.defer_s

    def fits_beside_pins(self) -> bool:
        self._ask("pins")
        return self.beside_pins


def demand(*, optional: bool = False, acquirer: bool = True) -> Demand:
    return Demand("t/a@r1", Tier.L0, optional, acquirer)


ROWS: list[tuple[str, Demand, TableRoom, type[Placement], object]] = [
    ("too large for the tier", demand(), TableRoom(too_large_error=TOO_LARGE), Fail, TOO_LARGE),
    ("free room", demand(), TableRoom(victim_list=()), Place, ()),
    ("free room, optional", demand(optional=True), TableRoom(victim_list=()), Place, ()),
    ("victims, demand", demand(), TableRoom(victim_list=(VICTIM,)), Place, (VICTIM,)),
    (
        "victims, policy defers an acquirer",
        demand(),
        TableRoom(victim_list=(VICTIM,), defer_s=0.4),
        Defer,
        0.4,
    ),
    (
        "victims, a pin-only demand never defers",
        demand(acquirer=False),
        TableRoom(victim_list=(VICTIM,), defer_s=0.4),
        Place,
        (VICTIM,),
    ),
    (
        "victims admitted, optional",
        demand(optional=True),
        TableRoom(victim_list=(VICTIM,)),
        Place,
        (VICTIM,),
    ),
    (
        "victims refused, optional",
        demand(optional=True),
        TableRoom(victim_list=(VICTIM,), policy_admits=False),
        Fail,
        CapacityError,
    ),
    (
        "no victims, optional",
        demand(optional=True),
        TableRoom(victim_list=None),
        Fail,
        CapacityError,
    ),
    ("no victims, acquirer", demand(), TableRoom(victim_list=None, beside_pins=False), Block, None),
    (
        "no victims, pin-only, pins fill the tier",
        demand(acquirer=False),
        TableRoom(victim_list=None, beside_pins=False),
        Fail,
        CapacityError,
    ),
    (
        "no victims, pin-only, room once copies in use leave",
        demand(acquirer=False),
        TableRoom(victim_list=None, beside_pins=True),
        Block,
        None,
    ),
]


@pytest.mark.parametrize(("row", "job", "room", "kind", "detail"), ROWS, ids=[r[0] for r in ROWS])
def test_decision_table(
    row: str, job: Demand, room: TableRoom, kind: type[Placement], detail: object
) -> None:
    placement = decide(job, room)
    assert type(placement) is kind, row
    if isinstance(placement, Place):
        assert placement.victims == detail
    elif isinstance(placement, Defer):
        assert placement.seconds == detail
    elif isinstance(placement, Fail):
        if isinstance(detail, type):
            assert type(placement.error) is detail
        else:
            assert placement.error is detail


def test_free_room_consults_neither_ranking_nor_policy() -> None:
    room = TableRoom(victim_list=())
    assert decide(demand(), room) == Place(())
    assert room.asked == ["victims"]  # plan_room answers [] without ranking (see the ledger)
