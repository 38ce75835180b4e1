"""A restarted ingress's ``FleetStanding`` over fake deployment calls: it starts from the durable
records (``standing_restore.Restored``: the registry's, an operator's pins among them) and the
pins the replicas report, so a replica that joins afterwards gets the pins, warm policies and
tenant settings that stood before the restart, a pin lifted afterwards is lifted on a replica
that was away then, and a pin no record names is lifted everywhere.
(tests/fleet/test_fleet_replica_pins.py: on a real fleet, the ingress killed.)"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

import pytest
from fleet_fakes import WAIT_S, FakeCalls, entry, key, polled_twice, started_link, wait_until

from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.engine.tenant_shares import TenantSettings
from loraplex.engine.transport.messages import Pin, SetWarm, Unpin, UpdateTenants
from loraplex.fleet import standing
from loraplex.fleet.board import PINS_KEY, BoardEntry
from loraplex.fleet.cache import FleetCache
from loraplex.fleet.link import FleetLink
from loraplex.fleet.standing_restore import PinKey, Restored, pin_owners, reported_pins
from loraplex.residency.ledger import Tier
from loraplex.server.pin_owners import OPERATOR, RELEASE, OwnedPins

OP = (key("ops"), Tier.L1)  # an operator's pin, held by the replicas before the restart
CAND = (key("cand"), Tier.L1)  # a release's candidate, pinned by the last ingress
# what the registry says: the operator's pin recorded, the release needing work
RECORDS = Restored(release_keys=frozenset({CAND[0]}), operator_pins=frozenset({OP}))


def holding(replica_id: str, pins: Iterable[PinKey], *, healthy: bool = True) -> BoardEntry:
    """A board entry of a replica that reports holding ``pins``."""
    board = entry(replica_id, healthy=healthy)
    board.status[PINS_KEY] = sorted(pins, key=standing.pin_order)
    return board


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(standing, "RETRY_S", 0.05)


@pytest.fixture
def calls() -> FakeCalls:
    return FakeCalls(board=[holding("a", [OP, CAND]), holding("b", [OP, CAND])])


@pytest.fixture
def link(calls: FakeCalls) -> Iterator[FleetLink]:
    built = started_link(calls)
    yield built
    built.close()


def _restarted(link: FleetLink, restored: Restored = RECORDS) -> FleetCache:
    """The new ingress's cache once it has seen the board (twice: its first sync ran)."""
    cache = FleetCache(link, restored)
    polled_twice(link)
    return cache


def test_a_replica_that_joins_after_a_restart_gets_the_pins_that_stood(
    calls: FakeCalls, link: FleetLink
) -> None:
    _restarted(link)
    # a and b hold every pin that stands: each is sent once more (a failed load is retried)
    wait_until(lambda: len(calls.calls) == 4, "a and b pinned again")
    assert sorted(calls.commands_to("a"), key=str) == [Pin(*CAND), Pin(*OP)]
    assert calls.commands_to("a") == calls.commands_to("b")
    calls.board = [*calls.board, holding("new", [])]
    wait_until(lambda: len(calls.commands_to("new")) == 2, "the replacement pinned")
    assert calls.commands_to("new") == [Pin(*CAND), Pin(*OP)]
    polled_twice(link)
    assert len(calls.calls) == 6


def test_a_pin_lifted_after_a_restart_is_lifted_on_a_replica_away_then(
    calls: FakeCalls, link: FleetLink
) -> None:
    calls.board = [holding("a", [OP, CAND]), holding("b", [OP, CAND], healthy=False)]
    cache = _restarted(link)
    wait_until(lambda: len(calls.commands_to("a")) == 2, "a pinned again")
    cache.unpin(*CAND)  # the release ends while b is out of rotation
    assert calls.commands_to("b") == []
    calls.board = [holding("a", [OP]), holding("b", [OP, CAND])]
    wait_until(lambda: Unpin(*CAND) in calls.commands_to("b"), "b unpinned")
    polled_twice(link)
    assert calls.commands_to("b") == [Unpin(*CAND), Pin(*OP)]
    assert calls.commands_to("a") == [Pin(*CAND), Pin(*OP), Unpin(*CAND)]


def test_a_pin_only_some_healthy_replicas_hold_is_lifted_not_adopted(
    calls: FakeCalls, link: FleetLink
) -> None:
    # the last ingress lifted CAND while b was away, and died before b was back
    calls.board = [holding("a", [OP]), holding("b", [OP, CAND])]
    _restarted(link)
    wait_until(lambda: calls.commands_to("b") == [Unpin(*CAND), Pin(*OP)], "b unpinned")
    calls.board = [*calls.board, holding("new", [])]
    wait_until(lambda: len(calls.commands_to("new")) == 1, "the replacement pinned")
    assert calls.commands_to("new") == [Pin(*OP)]
    assert calls.commands_to("a") == [Pin(*OP)]


def test_nothing_is_sent_before_a_healthy_replica_shows_what_stands(
    calls: FakeCalls, link: FleetLink
) -> None:
    calls.board = [holding("a", [OP, CAND], healthy=False)]
    cache = _restarted(link)
    cache.unpin(*OP)  # lifted before any replica could say what stood: not adopted
    polled_twice(link)
    assert calls.calls == []
    calls.board = [holding("a", [OP, CAND]), holding("b", [OP, CAND])]
    wait_until(lambda: len(calls.calls) == 4, "OP lifted on both")
    assert calls.commands_to("a") == calls.commands_to("b") == [Unpin(*OP), Pin(*CAND)]


def test_the_registrys_state_stands_from_the_start_and_is_replayed_once(
    calls: FakeCalls, link: FleetLink
) -> None:
    held = (key("held"), Tier.L1)  # a release's baseline the registry says is held
    tenants = {"acme": TenantSettings(weight=2.0)}
    warm = {key("warm"): WarmPolicy.CPU}
    restored = Restored(frozenset({held}), frozenset({held[0]}), warm, tenants)
    calls.board = [holding("a", []), holding("b", [])]
    _restarted(link, restored)
    expected = [UpdateTenants(tenants), SetWarm(key("warm"), WarmPolicy.CPU), Pin(*held)]
    for replica_id in ("a", "b"):
        wait_until(lambda r=replica_id: len(calls.commands_to(r)) == 3, f"{replica_id} in line")
        assert calls.commands_to(replica_id) == expected
    polled_twice(link)
    assert len(calls.calls) == 6  # once each


def test_adopted_pins_keep_their_owners_so_a_release_never_lifts_an_operators(
    calls: FakeCalls, link: FleetLink
) -> None:
    restored = RECORDS
    cache = _restarted(link, restored)
    wait_until(lambda: len(calls.commands_to("a")) == 2, "a pinned again")
    calls.calls.clear()
    pins = OwnedPins(cache)
    cache.on_adopted(lambda adopted: pins.adopt(pin_owners(adopted, restored)))
    assert pins.owners(*OP) == {OPERATOR} and pins.owners(*CAND) == {RELEASE}
    pins.pin(*OP, owner=RELEASE).result(WAIT_S)  # a release of the operator's pinned revision
    pins.unpin(*OP, owner=RELEASE)  # ends: the operator's pin stays
    pins.unpin(*CAND, owner=RELEASE)  # the release's own pin is lifted
    assert Unpin(*OP) not in calls.commands_to("a")
    assert calls.commands_to("a") == [Pin(*OP), Unpin(*CAND)]


def test_a_pin_no_record_names_is_lifted_on_every_replica_and_said(
    calls: FakeCalls, link: FleetLink, caplog: pytest.LogCaptureFixture
) -> None:
    # the last ingress removed OP's record and died before the replicas heard the unpin (or a
    # loraplex before schema 8 pinned it): the registry is the record, so it is lifted
    with caplog.at_level(logging.WARNING, logger="loraplex.fleet.standing_restore"):
        _restarted(link, Restored(release_keys=frozenset({CAND[0]})))
        wait_until(lambda: len(calls.calls) == 4, "OP lifted on a and b")
    assert calls.commands_to("a") == calls.commands_to("b") == [Unpin(*OP), Pin(*CAND)]
    assert any("lifting 1 pins" in m and "acme/ops@r1 in L1" in m for m in caplog.messages)


def test_the_registrys_operator_pins_stand_from_the_start(
    calls: FakeCalls, link: FleetLink
) -> None:
    calls.board = [holding("a", []), holding("b", [])]  # every replica new: nothing to adopt
    _restarted(link)
    wait_until(lambda: len(calls.calls) == 2, "OP pinned on a and b")
    assert calls.commands_to("a") == calls.commands_to("b") == [Pin(*OP)]


def test_a_malformed_reported_pin_is_skipped() -> None:
    board = holding("a", [OP])
    board.status[PINS_KEY] = [*board.status[PINS_KEY], ("acme/ops@r1", "L1"), 7]
    assert reported_pins(board) == {OP}
    board.status[PINS_KEY] = "junk"
    assert reported_pins(board) == set()
