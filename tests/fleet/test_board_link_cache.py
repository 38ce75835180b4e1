"""The fleet board (injected clock), ``FleetLink`` and ``FleetCache`` over fake deployment calls:
commands reach every healthy replica, reads answer from the board, standing state is replayed
to replicas that join later."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError, Future
from types import SimpleNamespace
from typing import Any

import pytest
from fleet_fakes import (
    WAIT_S,
    FakeCalls,
    entry,
    key,
    polled_twice,
    report,
    started_link,
    summary,
    wait_until,
)

from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.engine.tenant_shares import TenantSettings
from loraplex.engine.transport.messages import (
    CacheCommand,
    DropAutoWarm,
    Evict,
    Holds,
    Pin,
    Prefetch,
    SetWarm,
    Snapshot,
    Unpin,
    UpdateTenants,
)
from loraplex.engine.transport.packed_errors import unpack_error
from loraplex.errors import EngineUnavailableError, QueueFullError
from loraplex.fleet import board as board_module
from loraplex.fleet.board import FORGET_AFTER_S, STALE_AFTER_S, Board
from loraplex.fleet.cache import FleetCache, merge_stages, sum_summaries
from loraplex.fleet.deployments import EngineDeploymentImpl
from loraplex.fleet.link import FleetLink
from loraplex.fleet.wire import RouteHint
from loraplex.residency.cache.view import CopyHolds, EntrySnapshot, ResidencySnapshot, Unpinned
from loraplex.residency.ledger import Tier
from loraplex.residency.stats import StageSummary
from loraplex.residency.warm import WarmHold
from loraplex.router.reports import MAX_EXACT_KEYS, MAX_REPLICA_ID_CHARS

# --- Board ----------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def _ids(board: Board) -> list[str]:
    return [e.replica_id for e in board.entries()]


def test_a_silent_replica_goes_stale_then_is_forgotten() -> None:
    clock = Clock()
    board = Board(clock)
    board.put({"replica_id": "b", "healthy": True})
    board.put({"replica_id": "a", "healthy": False})
    clock.now_s += STALE_AFTER_S
    a, b = board.entries()
    assert (a.replica_id, a.healthy, a.fresh) == ("a", False, True)  # fresh, but not taking work
    assert (b.replica_id, b.healthy, b.age_s) == ("b", True, STALE_AFTER_S)
    clock.now_s += 0.5
    board.put({"replica_id": "a", "healthy": True})
    a, b = board.entries()
    assert a.healthy and a.age_s == 0.0
    assert not b.healthy and not b.fresh and b.status["healthy"]  # stale: out of rotation
    clock.now_s = 100.0 + FORGET_AFTER_S  # b silent for exactly FORGET_AFTER_S: still listed
    assert _ids(board) == ["a", "b"]
    clock.now_s += 0.25
    assert _ids(board) == ["a"]


def test_the_board_takes_the_fleets_bound_and_says_why_a_replica_is_out() -> None:
    clock = Clock()
    board = Board(clock, stale_after_s=1.5)
    hung = "the engine is hung: no progress for 10.2 s with work pending; retry shortly"
    board.put({"replica_id": "a", "healthy": True, "down_reason": None})
    board.put({"replica_id": "b", "healthy": False, "hung": True, "down_reason": hung})
    board.put({"replica_id": "c", "healthy": False})
    a, b, c = board.entries()
    assert a.healthy and a.down_reason is None
    assert (b.healthy, b.down_reason) == (False, hung)
    assert (c.healthy, c.down_reason) == (False, "its engine is down")
    clock.now_s += 1.5
    assert board.entries()[0].healthy  # at the bound: fresh
    clock.now_s += 0.25
    a, _, _ = board.entries()
    assert not a.healthy and a.stale_after_s == 1.5
    assert a.down_reason is not None and a.down_reason.startswith("stale report: none for 1.8 s")
    board.put({"replica_id": "a", "healthy": True})  # its pushes resume
    assert board.entries()[0].healthy and board.entries()[0].down_reason is None


@pytest.mark.parametrize("replica_id", [None, "", 7, "x" * (MAX_REPLICA_ID_CHARS + 1)])
def test_bad_replica_ids_are_refused(replica_id: Any) -> None:
    board = Board(Clock())
    with pytest.raises(ValueError, match=r"status replica_id .* is invalid"):
        board.put({"replica_id": replica_id, "healthy": True})
    assert board.entries() == []


def test_the_board_holds_at_most_max_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(board_module, "MAX_REPLICAS", 3)
    clock = Clock()
    board = Board(clock)
    for rid in ("a", "b", "c"):
        board.put({"replica_id": rid})
    with pytest.raises(ValueError, match="holds 3 replicas"):
        board.put({"replica_id": "d"})
    board.put({"replica_id": "a", "healthy": True})  # a known replica may always report
    assert _ids(board) == ["a", "b", "c"]
    clock.now_s += FORGET_AFTER_S + 1
    board.put({"replica_id": "d"})  # the silent ones were forgotten first
    assert _ids(board) == ["d"]


def test_remove_drops_a_replica_at_once() -> None:
    board = Board(Clock())
    board.put({"replica_id": "a", "healthy": True})
    board.put({"replica_id": "b", "healthy": True})
    board.remove("a")
    board.remove("unknown")
    assert _ids(board) == ["b"]


# --- FleetLink ------------------------------------------------------------------------------


def test_the_link_reads_the_board_and_counts_departures() -> None:
    calls = FakeCalls(board=[entry("a"), entry("b", healthy=False), entry("c", age_s=60.0)])
    link = started_link(calls)
    try:
        assert [e.replica_id for e in link.entries()] == ["a", "b", "c"]
        assert link.healthy_ids() == ["a"]
        calls.board = [entry("b")]
        wait_until(lambda: link.num_departed == 2, "a and c departed")
        assert link.healthy_ids() == ["b"]
        calls.board_error = RuntimeError("the board restarts")
        reads = calls.num_board_reads
        calls.board = []  # not read while the board fails: the last view stays
        wait_until(lambda: calls.num_board_reads >= reads + 2, "two failed reads")
        assert link.healthy_ids() == ["b"]
        calls.board_error = None
        calls.board = [entry("a"), entry("b")]  # a back again: not a new departure
        wait_until(lambda: link.healthy_ids() == ["a", "b"], "a back")
        assert link.num_departed == 2
        calls.board = [entry("a")]
        wait_until(lambda: link.num_departed == 3, "b departed")
    finally:
        link.close()


def test_link_calls_reach_the_chosen_replicas() -> None:
    calls = FakeCalls(board=[entry("a"), entry("b")], reply=lambda rid, c: f"{rid}:{c}")
    link = started_link(calls)
    try:
        assert link.call("b", Snapshot()).result(WAIT_S) == "b:Snapshot()"
        futures = link.call_each(Snapshot())
        assert {rid: f.result(WAIT_S) for rid, f in futures.items()} == {
            "a": "a:Snapshot()",
            "b": "b:Snapshot()",
        }
        assert list(link.call_each(Snapshot(), ["b"])) == ["b"]
        calls.gates["a"] = threading.Event()  # never opened
        held = link.call("a", Snapshot())
    finally:
        link.close()
    with pytest.raises(CancelledError):  # cancelled by close, not left waiting
        held.result(WAIT_S)
    with pytest.raises(EngineUnavailableError, match="the fleet link is closed"):
        link.call("b", Snapshot()).result(WAIT_S)


# --- FleetCache -----------------------------------------------------------------------------


@pytest.fixture
def calls() -> FakeCalls:
    """conftest's board and a replica out of rotation (``link`` and ``cache``: conftest's)."""
    return FakeCalls(board=[entry("a"), entry("b"), entry("sick", healthy=False)])


def _sent(calls: FakeCalls, command: CacheCommand) -> list[str]:
    return sorted(rid for rid, c in calls.calls if c == command)


def test_a_pin_completes_only_once_every_healthy_replica_holds_it(
    calls: FakeCalls, cache: FleetCache
) -> None:
    gate = calls.gates["b"] = threading.Event()
    future = cache.pin(key(), Tier.L0)
    wait_until(lambda: "a" in calls.done, "a pinned")
    assert not future.done()  # b still loading
    gate.set()
    assert future.result(WAIT_S) is None
    assert _sent(calls, Pin(key(), Tier.L0)) == ["a", "b"]  # never the unhealthy one


def test_a_pin_fails_when_one_replica_fails(calls: FakeCalls, cache: FleetCache) -> None:
    def reply(replica_id: str, command: CacheCommand) -> None:
        if replica_id == "b":
            raise QueueFullError("loads", 4, 1.0)

    calls.reply = reply
    with pytest.raises(QueueFullError):
        cache.pin(key(), Tier.L1).result(WAIT_S)
    with pytest.raises(QueueFullError):
        cache.prefetch(key(), Tier.L1).result(WAIT_S)
    assert _sent(calls, Prefetch(key(), Tier.L1)) == ["a", "b"]


def _left(target: str) -> BaseException:
    """The refusal a fleet's live replica answers for a call meant for ``target``, a replica the
    ingress's request router no longer offers (``deployments``: its ``_misrouted``)."""
    taker = SimpleNamespace(_replica=SimpleNamespace(replica_id="live"))
    refused = EngineDeploymentImpl._misrouted(taker, RouteHint(target=target))  # type: ignore[arg-type]
    assert refused is not None
    return unpack_error(refused.error)


def test_a_replica_that_died_before_the_board_marked_it_fails_no_fleet_wide_change(
    calls: FakeCalls, cache: FleetCache
) -> None:
    """Ray Serve drops a dead replica from its router at once; the board shows it healthy
    until its reports are ``stale_after_s`` old. A change made meanwhile is refused for it by
    the replica that took its call: it is left out, and the live replicas' answer stands (on
    main every change failed with 503 "engine replica b is not in rotation", though the live
    replicas and the registry had it: docs/benchmarks/attackfleet3.md)."""

    def reply(replica_id: str, command: CacheCommand) -> Any:
        if replica_id == "b":
            raise _left("b")
        if isinstance(command, Unpin):
            return Unpinned(True)
        if isinstance(command, Snapshot):
            return ResidencySnapshot((), summary().stats, 0, 0)
        return isinstance(command, Evict) or None

    calls.reply = reply
    settings = {"acme": TenantSettings(max_running_seqs=3)}
    cache.update_tenant_settings(settings)
    assert cache.pin(key(), Tier.L1).result(WAIT_S) is None
    assert cache.prefetch(key(), Tier.L1).result(WAIT_S) is None
    assert cache.unpin(key(), Tier.L1) == Unpinned(True)
    assert cache.evict(key(), Tier.L1) is True
    cache.set_warm_policy(key(), WarmPolicy.GPU)
    assert cache.snapshot().entries == ()
    assert set(_sent(calls, UpdateTenants(settings))) == {"a", "b"}  # b again: the replays
    # a replica that failed for another reason still fails the change
    calls.reply = lambda rid, c: (_ for _ in ()).throw(QueueFullError("loads", 4, 1.0))
    with pytest.raises(QueueFullError):
        cache.prefetch(key(), Tier.L1).result(WAIT_S)


def test_a_change_every_replica_of_which_had_left_still_fails(
    calls: FakeCalls, cache: FleetCache
) -> None:
    def reply(replica_id: str, command: CacheCommand) -> Any:
        raise _left(replica_id)

    calls.reply = reply
    with pytest.raises(EngineUnavailableError, match="not in rotation"):
        cache.pin(key(), Tier.L1).result(WAIT_S)
    with pytest.raises(EngineUnavailableError, match="not in rotation"):
        cache.update_tenant_settings({"acme": TenantSettings(weight=2.0)})
    with pytest.raises(EngineUnavailableError, match="not in rotation"):
        cache.evict(key(), Tier.L1)


def test_unpin_evict_and_warm_policies_reach_every_healthy_replica(
    calls: FakeCalls, cache: FleetCache
) -> None:
    calls.reply = lambda rid, c: isinstance(c, Evict) and rid == "b"
    cache.unpin(key(), Tier.L0)
    assert cache.evict(key(), Tier.L1) is True
    cache.set_warm_policy(key(), WarmPolicy.GPU)
    cache.drop_auto_warm(key())  # a deprecation: each replica's automatic seat goes
    settings = {"acme": TenantSettings(weight=2.0)}
    cache.update_tenant_settings(settings)
    assert _sent(calls, Unpin(key(), Tier.L0)) == ["a", "b"]
    assert _sent(calls, Evict(key(), Tier.L1)) == ["a", "b"]
    assert _sent(calls, SetWarm(key(), WarmPolicy.GPU)) == ["a", "b"]
    assert _sent(calls, DropAutoWarm(key())) == ["a", "b"]
    assert _sent(calls, UpdateTenants(settings)) == ["a", "b"]
    calls.reply = lambda rid, c: False
    assert cache.evict(key(), Tier.L1) is False


def test_unpin_and_holds_merge_every_replica_answer(calls: FakeCalls, cache: FleetCache) -> None:
    """A fleet's unpin names each warm policy that pins the copy on some replica (their
    automatic policies differ), and a kept copy's holds are summed over the replicas."""
    gpu = WarmHold(WarmPolicy.GPU, automatic=True)
    unpinned = {"a": Unpinned(True), "b": Unpinned(False, frozenset({gpu}))}
    held = {
        "a": CopyHolds(resident=True, pinned=False, in_use=2),
        "b": CopyHolds(resident=True, pinned=False, warm=frozenset({gpu}), in_use=1),
    }
    calls.reply = lambda rid, c: unpinned[rid] if isinstance(c, Unpin) else held[rid]
    assert cache.unpin(key(), Tier.L0) == Unpinned(True, frozenset({gpu}))
    merged = CopyHolds(resident=True, pinned=False, warm=frozenset({gpu}), in_use=3)
    assert cache.holds(key(), Tier.L0) == merged
    assert _sent(calls, Holds(key(), Tier.L0)) == ["a", "b"]
    calls.reply = lambda rid, c: None  # a replica of an older release names no holder
    assert cache.unpin(key(), Tier.L0) == Unpinned(False)


def test_summary_sums_the_healthy_replicas(calls: FakeCalls, link: FleetLink) -> None:
    calls.board = [
        entry("a", cache_summary=summary(copies=1, used=100, hits=2)),
        entry("b", cache_summary=summary(copies=2, used=50, hits=3)),
        entry("c", age_s=30.0, cache_summary=summary(copies=9, used=900)),
    ]
    polled_twice(link)
    total = FleetCache(link).summary()
    assert total.num_copies == {Tier.L1: 3}
    assert total.used_bytes == {Tier.L1: 150} and total.capacity_bytes == {Tier.L1: 2000}
    assert total.stats.hits == {Tier.L0: 5}
    calls.board = [entry("c", age_s=30.0)]
    polled_twice(link)
    with pytest.raises(EngineUnavailableError):
        FleetCache(link).summary()


def test_sums_add_counters_and_take_the_largest_percentiles() -> None:
    one = StageSummary(count=2, total_s=1.0, p50_s=0.4, p95_s=0.6, max_s=0.6)
    two = StageSummary(count=3, total_s=3.0, p50_s=0.9, p95_s=1.2, max_s=1.5)
    assert merge_stages([one, two]) == StageSummary(5, 4.0, 0.9, 1.2, 1.5)
    total = sum_summaries([summary(copies=1, used=10), summary(copies=4, used=20)])
    assert total.num_copies == {Tier.L1: 5} and total.stats.resident_bytes == {Tier.L1: 30}
    assert total.num_loading == 0 and total.stats.room_wait is None


def test_is_resident_reads_the_healthy_replicas_reports(calls: FakeCalls, link: FleetLink) -> None:
    wanted = str(key())
    calls.board = [
        entry("a", reported=report("a", l1=[wanted])),
        entry("b", age_s=30.0, reported=report("b", l0=[wanted])),  # stale: not counted
    ]
    polled_twice(link)
    cache = FleetCache(link)
    assert cache.is_resident(key(), Tier.L1)
    assert not cache.is_resident(key(), Tier.L0)
    assert not cache.is_resident(key(revision="r2"), Tier.L1)
    assert not cache.is_resident(key(), Tier.L3)


def test_is_resident_decodes_a_report_once_and_reads_a_new_one_at_once(
    calls: FakeCalls, link: FleetLink
) -> None:
    """Each replica's report is decoded once per number (every request asks for its arrival
    tier), and a new report (a new number) replaces it at the next look: a copy the replica
    no longer holds is never counted resident."""
    wanted = str(key())
    first = entry("a", reported=report("a", l0=[wanted]))
    calls.board = [first]
    polled_twice(link)
    cache = FleetCache(link)
    assert cache.is_resident(key(), Tier.L0)
    first.status["report"] = "not decoded again"  # the same number: the decoded report stands
    assert cache.is_resident(key(), Tier.L0)
    calls.board = [entry("a", reported=report("a", l1=[wanted]))]  # evicted to L1
    polled_twice(link)
    assert not cache.is_resident(key(), Tier.L0)
    assert cache.is_resident(key(), Tier.L1)
    calls.board = [entry("a", reported=report("a")), entry("b")]
    calls.board[0].status["report"] = {"v": 0}  # refused: that replica holds nothing
    polled_twice(link)
    assert not cache.is_resident(key(), Tier.L1)


def test_is_resident_reads_a_set_sent_as_a_bloom_filter(calls: FakeCalls, link: FleetLink) -> None:
    many = [str(key(revision=f"r{i}")) for i in range(MAX_EXACT_KEYS + 1)]
    calls.board = [entry("a", reported=report("a", l1=many))]
    polled_twice(link)
    cache = FleetCache(link)
    assert cache.is_resident(key(revision="r7"), Tier.L1)
    assert not cache.is_resident(key(revision="r7"), Tier.L0)


def test_snapshot_lists_every_healthy_replicas_copies(calls: FakeCalls, cache: FleetCache) -> None:
    calls.reply = lambda rid, c: ResidencySnapshot((), summary().stats, 1, 2)
    snapshot = cache.snapshot()
    assert (snapshot.num_loading, snapshot.num_blocked) == (2, 4)
    assert _sent(calls, Snapshot()) == ["a", "b"]


def test_snapshot_names_the_replica_of_each_copy(calls: FakeCalls, cache: FleetCache) -> None:
    """``/admin/residency`` of a fleet listed a revision on two replicas as two rows that did
    not say which replica held which copy."""
    copy = EntrySnapshot(key(), Tier.L1, 10, True, True, 0, None, 1, 1, 0, 0.0)
    calls.reply = lambda rid, c: ResidencySnapshot((copy,), summary().stats, 0, 0)
    snapshot = cache.snapshot()
    assert [(e.key, e.replica) for e in snapshot.entries] == [(key(), "a"), (key(), "b")]
    assert copy.replica is None  # one server's copies name none


def test_without_a_healthy_replica_loads_and_reads_fail(calls: FakeCalls, link: FleetLink) -> None:
    calls.board = [entry("a", healthy=False)]
    polled_twice(link)
    cache = FleetCache(link)
    failed: Future[None] = cache.pin(key(), Tier.L0)
    with pytest.raises(EngineUnavailableError, match="no engine replica is in rotation"):
        failed.result(WAIT_S)
    with pytest.raises(EngineUnavailableError):
        cache.prefetch(key(), Tier.L0).result(WAIT_S)
    with pytest.raises(EngineUnavailableError):
        cache.snapshot()
    assert calls.calls == []


def test_standing_state_is_replayed_to_a_joining_replica_only(
    calls: FakeCalls, link: FleetLink, cache: FleetCache
) -> None:
    settings = {"acme": TenantSettings(weight=3.0)}
    cache.update_tenant_settings(settings)
    cache.set_warm_policy(key("warm"), WarmPolicy.CPU)
    cache.set_warm_policy(key("cold"), WarmPolicy.GPU)
    # an operator's on_demand is replayed (automatic promotion off there too, as the registry
    # reads it back: schema 8); it was dropped, so a joining replica promoted it on its own
    cache.set_warm_policy(key("cold"), WarmPolicy.ON_DEMAND)
    cache.set_warm_policy(key("auto"), WarmPolicy.GPU)
    cache.set_warm_policy(key("auto"), None)  # back to automatic: not replayed
    cache.pin(key("pinned"), Tier.L0).result(WAIT_S)
    cache.pin(key("lifted"), Tier.L1).result(WAIT_S)
    cache.unpin(key("lifted"), Tier.L1)
    sent_to_a = len(calls.commands_to("a"))
    calls.board = [entry("a"), entry("b"), entry("new")]
    wait_until(lambda: len(calls.commands_to("new")) == 4, "the state replayed to new")
    assert calls.commands_to("new") == [
        UpdateTenants(settings),
        SetWarm(key("warm"), WarmPolicy.CPU),
        SetWarm(key("cold"), WarmPolicy.ON_DEMAND),
        Pin(key("pinned"), Tier.L0),
    ]
    polled_twice(link)
    assert len(calls.commands_to("new")) == 4  # known now: not replayed again
    assert len(calls.commands_to("a")) == sent_to_a


def test_a_pin_lifted_once_is_not_replayed_however_often_it_was_set(
    calls: FakeCalls, link: FleetLink, cache: FleetCache
) -> None:
    # NOTE: a replica cache keeps one pin per (revision, tier), and the release controller pins a
    # candidate twice (prewarm, then hold) before one unpin: the fleet must agree.
    cache.pin(key(), Tier.L1).result(WAIT_S)
    cache.pin(key(), Tier.L1).result(WAIT_S)
    cache.unpin(key(), Tier.L1)
    calls.board = [entry("a"), entry("b"), entry("new")]
    polled_twice(link)
    assert calls.commands_to("new") == []
