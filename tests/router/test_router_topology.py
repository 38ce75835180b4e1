"""Fleet topology (router/topology.py, docs/modes.md "In a fleet"): one replica is dedicated to a
revision whose work would fill a replica of its own, with hysteresis and a dwell, and the
router steers that revision's traffic to it (reason ``merged``) until it saturates."""

from __future__ import annotations

import pytest
from router_kit import make_router, report, req

from loraplex.clock import ManualClock
from loraplex.router import Reason, ReplicaReport
from loraplex.router.placement import rendezvous_order
from loraplex.router.topology import (
    Dedication,
    FleetTopology,
    TopologyConfig,
    decide_topology,
)

HOT, WARM = "t/hot@1", "t/warm@1"
CONFIG = TopologyConfig(dedicate_demand=1.0, release_demand=0.6, min_dwell_s=60.0, min_requests=4)


def fleet(num: int = 4, **overrides: ReplicaReport | None) -> dict[str, ReplicaReport | None]:
    replicas: dict[str, ReplicaReport | None] = {f"r{i}": report(f"r{i}") for i in range(num)}
    replicas.update(overrides)
    return replicas


def test_a_revision_that_would_fill_a_replica_gets_one() -> None:
    # 4 replicas: a share of 0.25 is one replica's worth of work
    assert decide_topology(None, None, {HOT: 0.24}, fleet(), CONFIG) is None
    got = decide_topology(None, None, {HOT: 0.3, WARM: 0.2}, fleet(), CONFIG)
    assert got == Dedication("r0", HOT)  # all idle and cold: the lower id


def test_the_replica_chosen_already_merged_it_else_holds_it_else_is_least_loaded() -> None:
    shares = {HOT: 0.5}
    busy = fleet(r0=report("r0", tokens=900), r1=report("r1", tokens=100))
    assert decide_topology(None, None, shares, busy, CONFIG) == Dedication("r2", HOT)
    holding = fleet(r3=report("r3", l0=[HOT], tokens=5000))
    assert decide_topology(None, None, shares, holding, CONFIG) == Dedication("r3", HOT)
    merged = fleet(r2=report("r2", l0=[HOT], merged=[HOT]), r3=report("r3", l0=[HOT]))
    assert decide_topology(None, None, shares, merged, CONFIG) == Dedication("r2", HOT)


def test_hysteresis_and_dwell_keep_a_dedication_from_flapping() -> None:
    current = Dedication("r1", HOT)
    # within the band (0.6 <= demand < 1.0): kept
    assert decide_topology(current, 120.0, {HOT: 0.2}, fleet(), CONFIG) == current
    # below the band, but within the dwell: kept; after it: released
    assert decide_topology(current, 30.0, {HOT: 0.1}, fleet(), CONFIG) == current
    assert decide_topology(current, 120.0, {HOT: 0.1}, fleet(), CONFIG) is None
    # a hotter revision does not take the replica while the dedicated one holds its band
    assert decide_topology(current, 120.0, {HOT: 0.2, WARM: 0.7}, fleet(), CONFIG) == current
    # no new dedication within the dwell of the last change either
    assert decide_topology(None, 30.0, {HOT: 0.9}, fleet(), CONFIG) is None


def test_a_lost_replica_or_a_small_fleet_ends_the_dedication() -> None:
    current = Dedication("r1", HOT)
    gone = fleet(r1=None)  # no fresh report: it does not count
    assert decide_topology(current, 1.0, {HOT: 0.9}, gone, CONFIG) == Dedication("r0", HOT)
    one = {"r0": report("r0")}
    assert decide_topology(current, 120.0, {HOT: 1.0}, one, CONFIG) is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("window_s", 0.0),
        ("release_demand", 1.0),
        ("min_replicas", 1),
        ("min_dwell_s", -1.0),
        ("min_requests", 0),
    ],
)
def test_a_bad_setting_is_refused_naming_it(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        TopologyConfig(**{field: value})  # type: ignore[arg-type]


def test_fleet_topology_counts_routed_tokens_asks_replicas_and_steers_the_router() -> None:
    clock = ManualClock()
    asked: list[tuple[str, str | None]] = []
    topology = FleetTopology(CONFIG, clock, lambda rid, key: asked.append((rid, key)))
    router, _ = make_router()
    replicas = fleet(
        2, r0=report("r0", l0=[HOT], tokens=500), r1=report("r1", l0=[HOT], tokens=100)
    )
    for _ in range(3):
        topology.record(req(HOT, tokens=100))
    topology.record(req(None, tokens=100))  # base-model work counts in the total: 0.75 of it
    router.dedication = topology.update(replicas)
    assert router.dedication == Dedication("r1", HOT)  # both hold it: the less loaded
    assert asked == [("r1", HOT)]
    decision = router.choose(req(HOT), replicas)
    assert (decision.replica_id, decision.reason) == ("r1", Reason.MERGED)
    assert router.choose(req(WARM), replicas).reason is not Reason.MERGED
    # the window empties: after the dwell the replica is given back, once
    clock.advance(CONFIG.min_dwell_s + CONFIG.window_s + 1.0)
    router.dedication = topology.update(replicas)
    assert router.dedication is None
    assert asked == [("r1", HOT), ("r1", None)]
    assert topology.update(replicas) is None and topology.num_changes == 2


def test_a_window_of_few_requests_dedicates_nothing() -> None:
    # A fresh fleet's first request is all of the window (a share of 1.0): with uniform
    # traffic over 16 revisions it dedicated a replica to whichever came first, for the dwell.
    clock = ManualClock()
    asked: list[tuple[str, str | None]] = []
    topology = FleetTopology(TopologyConfig(), clock, lambda rid, key: asked.append((rid, key)))
    replicas = fleet(2)
    for i in range(TopologyConfig().min_requests - 1):
        topology.record(req(HOT if i == 0 else f"t/r{i}@1", tokens=100))
        assert topology.update(replicas) is None
    assert asked == []
    # below the count none is made, but one is still kept in its band or given back
    current = Dedication("r1", HOT)
    assert decide_topology(current, 120.0, {HOT: 0.9}, fleet(), CONFIG, num_requests=1) == current
    assert decide_topology(current, 120.0, {}, fleet(), CONFIG, num_requests=1) is None
    assert decide_topology(None, None, {HOT: 0.9}, fleet(), CONFIG, num_requests=3) is None
    got = decide_topology(None, None, {HOT: 0.9}, fleet(), CONFIG, num_requests=4)
    assert got == Dedication("r0", HOT)


def test_a_dedicated_replica_that_saturates_is_not_chosen() -> None:
    router, _ = make_router(max_queued=8)
    router.dedication = Dedication("r0", HOT)
    replicas = fleet(2, r0=report("r0", l0=[HOT], queued=8), r1=report("r1", l0=[HOT]))
    decision = router.choose(req(HOT), replicas)
    assert decision.replica_id == "r1" and decision.reason is Reason.GPU_HIT


def _first_in_order(replica_id: str, replica_ids: list[str]) -> str:
    """A tail revision whose rendezvous order over ``replica_ids`` starts at ``replica_id``."""
    return next(
        key
        for key in (f"t/tail{i}@1" for i in range(1000))
        if rendezvous_order(key, replica_ids)[0] == replica_id
    )


def test_a_dedicated_replica_takes_no_cold_load_of_another_revision_while_another_is_open() -> None:
    # r0 is dedicated to HOT and idle; r1 and r2 are busy but open. Without the dedication
    # each cold load of a tail revision goes to r0 (the least loaded); with it, elsewhere.
    tail = _first_in_order("r0", ["r0", "r1", "r2"])
    replicas = fleet(
        3,
        r0=report("r0", l1=["t/l1@1"]),
        r1=report("r1", running=4, queued=7, l0=["t/held@1"]),  # open: queued < 8
        r2=report("r2", running=6),
    )
    plain, _ = make_router()
    dedicated, _ = make_router()
    dedicated.dedication = Dedication("r0", HOT)
    # rule 5, a placement; rule 3, an L1 copy on r0 only
    for key in (tail, "t/l1@1"):
        assert plain.choose(req(key), replicas).replica_id == "r0"
        decision = dedicated.choose(req(key), replicas)
        assert decision.replica_id != "r0"
        assert decision.reason is not Reason.DEDICATED_SPILL
    # rule 4: its only holder saturated, a new holder is the least loaded other replica
    replicas["r1"] = report("r1", running=4, queued=8, l0=["t/held@1"])
    replicas["r2"] = report("r2", running=6)
    plain, _ = make_router()
    dedicated, _ = make_router()
    dedicated.dedication = Dedication("r0", HOT)
    assert plain.choose(req("t/held@1"), replicas).replica_id == "r0"
    decision = dedicated.choose(req("t/held@1"), replicas)
    assert (decision.replica_id, decision.reason) == ("r2", Reason.SATURATED)


def test_a_dedicated_replica_in_a_saturated_placement_set_widens_it_past_itself() -> None:
    ids = ["r0", "r1", "r2"]
    tail = next(
        f"t/tail{i}@1"
        for i in range(1000)
        if rendezvous_order(f"t/tail{i}@1", ids)[:2] == ["r0", "r1"]
    )
    replicas = fleet(3, r1=report("r1", queued=8), r2=report("r2", running=3))
    router, _ = make_router()
    router.dedication = Dedication("r0", HOT)
    decision = router.choose(req(tail), replicas)
    assert (decision.replica_id, decision.reason) == ("r2", Reason.WIDENED)


def test_a_dedicated_replica_takes_another_revision_only_when_every_other_is_saturated() -> None:
    tail = _first_in_order("r1", ["r0", "r1", "r2"])
    full = {"queued": 8}
    replicas = fleet(3, r1=report("r1", **full), r2=report("r2", **full))
    router, _ = make_router()
    router.dedication = Dedication("r0", HOT)
    decision = router.choose(req(tail), replicas)
    assert (decision.replica_id, decision.reason) == ("r0", Reason.DEDICATED_SPILL)
    # its own revision, and another already in its GPU slots, are no cold load: as before
    replicas = fleet(3, r0=report("r0", l0=[HOT, "t/held@1"]))
    assert router.choose(req(HOT), replicas).reason is Reason.MERGED
    decision = router.choose(req("t/held@1"), replicas)
    assert (decision.replica_id, decision.reason) == ("r0", Reason.GPU_HIT)


def test_pure_affinity_keeps_a_dedicated_replica_from_another_revisions_cold_load() -> None:
    """``affinity`` follows the same exclusion as the default policy: a replica dedicated to
    another revision ranks after every other known replica for a revision it does not hold in
    GPU slots (no saturation rule here: it takes one only when it alone has a report)."""
    replicas = fleet(3, r0=report("r0", l1=["t/l1@1"]), r1=report("r1", running=6))
    plain, _ = make_router("affinity")
    dedicated, _ = make_router("affinity")
    dedicated.dedication = Dedication("r0", HOT)
    assert plain.choose(req("t/l1@1"), replicas).replica_id == "r0"  # its L1 copy wins
    decision = dedicated.choose(req("t/l1@1"), replicas)
    assert decision.replica_id == "r2" and decision.reason is Reason.PLACEMENT
    assert decision.ranked[-1] == "r0"
    # its own revision, and another already in its GPU slots, still go to it
    replicas = fleet(3, r0=report("r0", l0=[HOT, "t/held@1"]))
    assert dedicated.choose(req(HOT), replicas).reason is Reason.MERGED
    decision = dedicated.choose(req("t/held@1"), replicas)
    assert (decision.replica_id, decision.reason) == ("r0", Reason.GPU_HIT)
    # only it reports: it takes the cold load, reason dedicated_spill
    alone = fleet(3, r1=None, r2=None)
    decision = dedicated.choose(req("t/tail@1"), alone)
    assert (decision.replica_id, decision.reason) == ("r0", Reason.DEDICATED_SPILL)
