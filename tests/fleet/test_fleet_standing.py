"""``FleetStanding`` through ``FleetCache`` over fake deployment calls: the standing pins, warm
policies and tenant settings end up the same on every replica, one that joins later (a
replacement, a scale-up) or one that was out of rotation when they changed included, and a
replay that fails is tried again. (tests/fleet/test_fleet_replica_pins.py: on a real fleet.)"""

from __future__ import annotations

import pytest
from fleet_fakes import WAIT_S, FakeCalls, entry, key, polled_twice, wait_until

from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.engine.tenant_shares import TenantSettings
from loraplex.engine.transport.messages import CacheCommand, Pin, SetWarm, Unpin, UpdateTenants
from loraplex.errors import CapacityError, EngineUnavailableError
from loraplex.fleet import standing
from loraplex.fleet.cache import FleetCache
from loraplex.fleet.link import FleetLink
from loraplex.residency.ledger import Tier


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(standing, "RETRY_S", 0.05)


def _away(calls: FakeCalls, replica_id: str) -> None:
    """``replica_id`` out of rotation (stale, hung) while staying on the board."""
    calls.board = [entry(r.replica_id, healthy=r.replica_id != replica_id) for r in calls.board]


def test_a_replica_out_of_rotation_when_a_pin_is_lifted_is_unpinned_when_back(
    calls: FakeCalls, link: FleetLink, cache: FleetCache
) -> None:
    # The release's prewarm pin reached both replicas; b was out of rotation when the release
    # ended and the pin was lifted. It kept the pin for good: nobody would ever lift it.
    cache.pin(key("cand"), Tier.L1).result(WAIT_S)
    _away(calls, "b")
    polled_twice(link)
    cache.unpin(key("cand"), Tier.L1)
    assert calls.commands_to("b") == [Pin(key("cand"), Tier.L1)]
    calls.board = [entry("a"), entry("b")]
    wait_until(lambda: Unpin(key("cand"), Tier.L1) in calls.commands_to("b"), "b unpinned")
    polled_twice(link)
    assert calls.commands_to("b").count(Unpin(key("cand"), Tier.L1)) == 1  # once, not per poll
    assert calls.commands_to("a") == [Pin(key("cand"), Tier.L1), Unpin(key("cand"), Tier.L1)]


def test_a_replica_out_of_rotation_when_state_changes_gets_it_when_back(
    calls: FakeCalls, link: FleetLink, cache: FleetCache
) -> None:
    _away(calls, "b")
    polled_twice(link)
    settings = {"acme": TenantSettings(weight=2.0)}
    cache.update_tenant_settings(settings)
    cache.set_warm_policy(key("warm"), WarmPolicy.CPU)
    cache.pin(key("held"), Tier.L1).result(WAIT_S)
    assert calls.commands_to("b") == []
    calls.board = [entry("a"), entry("b")]
    wait_until(lambda: len(calls.commands_to("b")) == 3, "b brought in line")
    assert calls.commands_to("b") == [
        UpdateTenants(settings),
        SetWarm(key("warm"), WarmPolicy.CPU),
        Pin(key("held"), Tier.L1),
    ]
    polled_twice(link)
    assert len(calls.commands_to("b")) == 3
    assert len(calls.commands_to("a")) == 3  # a had every change: nothing replayed to it


def test_a_refused_replay_is_tried_again_until_the_joining_replica_has_it(
    calls: FakeCalls, link: FleetLink, cache: FleetCache
) -> None:
    # The board shows a new replica before the ingress's request router knows it: a call meant
    # for it is taken by another replica, which refuses it. The replay was then never retried,
    # and the replacement lacked the release's pins for good.
    routable = [False]

    def reply(replica_id: str, command: CacheCommand) -> None:
        if replica_id == "new" and not routable[0]:
            raise EngineUnavailableError("engine replica new is not in rotation")

    calls.reply = reply
    cache.pin(key("cand"), Tier.L1).result(WAIT_S)
    calls.board = [entry("a"), entry("b"), entry("new")]
    wait_until(lambda: len(calls.commands_to("new")) >= 2, "the replay tried twice")
    routable[0] = True
    answered = len(calls.done)
    wait_until(lambda: "new" in calls.done[answered:], "the replay answered")
    tries = len(calls.commands_to("new"))
    polled_twice(link)
    assert len(calls.commands_to("new")) == tries  # it has the pin: no more replays
    assert set(calls.commands_to("new")) == {Pin(key("cand"), Tier.L1)}


def test_a_pin_that_failed_to_load_is_still_lifted_everywhere(
    calls: FakeCalls, link: FleetLink, cache: FleetCache
) -> None:
    # A replica records a pin before it loads: a failed load leaves it pinned, so the unpin of
    # a failed prewarm (an aborted release) must reach that replica too, now or when it is back.
    def reply(replica_id: str, command: CacheCommand) -> None:
        if replica_id == "b" and isinstance(command, Pin):
            raise CapacityError("no room")

    calls.reply = reply
    with pytest.raises(CapacityError):
        cache.pin(key("bad"), Tier.L1).result(WAIT_S)
    _away(calls, "b")
    polled_twice(link)
    cache.unpin(key("bad"), Tier.L1)
    calls.board = [entry("a"), entry("b")]
    wait_until(lambda: Unpin(key("bad"), Tier.L1) in calls.commands_to("b"), "b unpinned")
    polled_twice(link)
    assert calls.commands_to("b")[-1] == Unpin(key("bad"), Tier.L1)
