"""A replica Ray Serve's request router dropped (it died) is out of every reader of the ingress's
board view at once, before its reports go stale: the load sum, the arrival tier, a fleet-wide
change, a release's probe and the standing replay (docs/benchmarks/fleetdeath.md)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from fleet_fakes import (
    WAIT_S,
    CharTokenizer,
    FakeCalls,
    FakeStream,
    entry,
    is_lost,
    key,
    load,
    polled_twice,
    report,
    wait_until,
)
from ray.serve.request_router import RequestRouter

from loraplex.clock import ManualClock
from loraplex.engine.protocol import EngineRequest, TokenDelta
from loraplex.engine.tenant_shares import TenantSettings
from loraplex.engine.transport.messages import CacheCommand, UpdateTenants
from loraplex.fleet import left_replicas, standing
from loraplex.fleet.cache import FleetCache
from loraplex.fleet.engine_client import FleetEngineClient
from loraplex.fleet.left_replicas import LeftReplicas
from loraplex.fleet.link import FleetLink
from loraplex.fleet.ray_router import LoraplexRequestRouter
from loraplex.fleet.release_env import FleetReleaseEnv
from loraplex.fleet.wire import Accepted, ReplicaLeftError, RouteHint
from loraplex.release.traffic import ReleaseTraffic
from loraplex.residency.ledger import Tier
from loraplex.server.pin_owners import OwnedPins

POLL_S = 0.01


@pytest.fixture
def left() -> LeftReplicas:
    return LeftReplicas()


@pytest.fixture
def calls() -> FakeCalls:
    """Two healthy replicas with fresh reports; ``b`` holds the revision in L1 and is busy."""
    wanted = str(key())
    return FakeCalls(
        board=[
            entry("a", engine_load=load(1, 1)),
            entry("b", reported=report("b", l1=[wanted]), engine_load=load(5, 2)),
        ]
    )


@pytest.fixture
def link(calls: FakeCalls, left: LeftReplicas) -> Iterator[FleetLink]:
    built = FleetLink(calls, poll_interval_s=POLL_S, left=left)
    assert built.wait_polled(WAIT_S)
    yield built
    built.close()


def _client(link: FleetLink, opened: list[str]) -> FleetEngineClient:
    def open_stream(request: EngineRequest, hint: RouteHint) -> FakeStream:
        assert hint.target is not None
        opened.append(hint.target)
        return FakeStream([Accepted(hint.target), TokenDelta((9,), " yes", None, 3, 1)])

    tokenizer: Any = CharTokenizer()
    return FleetEngineClient(open_stream, is_lost, link, tokenizer)


def test_a_replica_the_router_dropped_leaves_every_board_reader_at_once(
    calls: FakeCalls, link: FleetLink, left: LeftReplicas
) -> None:
    cache = FleetCache(link)
    polled_twice(link)
    client = _client(link, [])
    assert cache.is_resident(key(), Tier.L1)
    assert client.load_snapshot().num_waiting == 6
    left.mark_dropped(["a", "b"], ["a"])  # Ray Serve's controller removed b: it died
    # no board poll needed, and b's report is still fresh on the board
    assert [e.fresh for e in link.entries()] == [True, True]
    assert link.healthy_ids() == ["a"] and link.has_left("b")
    assert client.load_snapshot().num_waiting == 1  # its last load is no longer summed
    assert not cache.is_resident(key(), Tier.L1)  # the arrival tier no longer counts its copy
    b = link.entries()[1]  # as /admin/fleet shows it (``FleetStateView``)
    assert (b.replica_id, b.healthy) == ("b", False)
    assert b.down_reason is not None and b.down_reason.startswith("left Ray Serve's request")
    calls.calls.clear()
    cache.update_tenant_settings({"acme": TenantSettings(weight=2.0)})
    wait_until(lambda: calls.done == ["a"], "the change answered by a")
    assert [rid for rid, _ in calls.calls] == ["a"]  # never sent to b


def test_a_release_probe_skips_a_replica_the_router_dropped(
    link: FleetLink, left: LeftReplicas
) -> None:
    # NOTE: on main a probe went to every board-healthy replica; one sent to a dead replica is
    # refused by another (ReplicaLeftError) and the release failed its probe.
    opened: list[str] = []
    client = _client(link, opened)
    traffic = ReleaseTraffic(ManualClock(), tuple)
    env = FleetReleaseEnv(OwnedPins(FleetCache(link)), client, traffic, link)
    left.mark("b", "a call to it found it dead")
    try:
        assert env.probe(key(), "acme", "Hi", 1).result(WAIT_S) == " yes"
    finally:
        env.close()
    assert opened == ["a"]


@dataclass(frozen=True)
class _ReplicaId:
    unique_id: str  # what the router reads of Ray's ``ReplicaID``


def test_the_request_routers_drops_are_marked(monkeypatch: pytest.MonkeyPatch) -> None:
    marked = LeftReplicas()
    monkeypatch.setattr(left_replicas, "LEFT_REPLICAS", marked)

    def ray_update(self: Any, replicas: list[Any]) -> None:  # Ray's own bookkeeping, stubbed
        self._replicas = {r.replica_id: r for r in replicas}

    def ray_died(self: Any, replica_id: Any) -> None:
        self._replicas.pop(replica_id, None)

    monkeypatch.setattr(RequestRouter, "update_replicas", ray_update)
    monkeypatch.setattr(RequestRouter, "on_replica_actor_died", ray_died)
    monkeypatch.setattr(RequestRouter, "curr_replicas", property(lambda self: self._replicas))
    ids = {name: _ReplicaId(name) for name in "abcd"}
    router = LoraplexRequestRouter.__new__(LoraplexRequestRouter)
    router.initialize_state(seed=0)
    router._replicas = {}
    replicas = {name: SimpleNamespace(replica_id=i) for name, i in ids.items()}
    router.update_replicas([replicas["a"], replicas["b"], replicas["c"]])
    assert not any(name in marked for name in "abc")  # a first set drops nothing
    router.update_replicas([replicas["a"], replicas["c"], replicas["d"]])
    assert "b" in marked and "d" not in marked  # removed by the controller; d joined
    router.on_replica_actor_died(ids["c"])
    assert "c" in marked and "a" not in marked


def test_the_standing_replay_stops_for_a_replica_that_left_and_says_so_once(
    calls: FakeCalls,
    link: FleetLink,
    left: LeftReplicas,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(standing, "RETRY_S", 0.05)
    cache = FleetCache(link)
    polled_twice(link)

    def reply(replica_id: str, command: CacheCommand) -> Any:
        if replica_id == "b":  # dead: another replica refuses the call meant for it
            if len(calls.commands_to("b")) > 1:  # the router drops it while the replay runs
                left.mark("b", "a call to it found it dead")
            raise ReplicaLeftError("engine replica b is not in rotation")
        return None

    calls.reply = reply
    caplog.set_level(logging.INFO, logger="loraplex.fleet.standing")
    cache.update_tenant_settings({"acme": TenantSettings(weight=2.0)})  # b misses it
    wait_until(lambda: "nothing more is sent" in caplog.text, "the replay's end logged")
    for _ in range(5):  # 0.05 s retries: several would have gone out by now
        polled_twice(link)
    to_b = calls.commands_to("b")
    assert to_b == [UpdateTenants({"acme": TenantSettings(weight=2.0)})] * 2  # change, replay
    records = [r for r in caplog.records if r.name == "loraplex.fleet.standing"]
    assert [r.levelno for r in records] == [logging.INFO]  # once, and not a WARNING
    assert "replica b left Ray Serve's request router" in records[0].getMessage()


def test_a_replay_refused_for_a_replica_the_router_does_not_know_yet_is_info_and_retried(
    calls: FakeCalls,
    link: FleetLink,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(standing, "RETRY_S", 0.05)
    cache = FleetCache(link)
    polled_twice(link)
    cache.update_tenant_settings({"acme": TenantSettings(weight=2.0)})
    refusals = [2]

    def reply(replica_id: str, command: CacheCommand) -> Any:
        if replica_id == "c" and refusals[0]:  # new: the router does not offer it yet
            refusals[0] -= 1
            raise ReplicaLeftError("engine replica c is not in rotation")
        return None

    calls.reply = reply
    caplog.set_level(logging.INFO, logger="loraplex.fleet.standing")
    calls.board = [*calls.board, entry("c")]
    wait_until(lambda: "has the standing cache state now" in caplog.text, "c brought in line")
    records = [r for r in caplog.records if r.name == "loraplex.fleet.standing"]
    assert [r.levelno for r in records] == [logging.INFO, logging.INFO]
    assert "not yet in the ingress's request router" in records[0].getMessage()
