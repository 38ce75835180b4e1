"""The router reuses a replica's view across decisions while its report, its pending decisions
and its dedication are the same objects (``Router.view``); a view that any of them changed is
rebuilt, so a stale one is never read."""

from __future__ import annotations

import random
from collections.abc import Iterator

from router_kit import idle, make_router, report, req

from loraplex.clock import ManualClock
from loraplex.router import ReplicaReport, Router, RouteRequest
from loraplex.router.topology import Dedication
from loraplex.router.view import MAX_TIERS_CACHED, ReplicaView, Tier, held_keys


def _views(router: object, fleet: dict[str, ReplicaReport | None]) -> dict[str, ReplicaView]:
    return {v.replica_id: v for v in router.view(fleet)}  # type: ignore[attr-defined]


def test_a_view_is_kept_while_nothing_changes_and_rebuilt_for_a_decision_there() -> None:
    router, _ = make_router()
    fleet = idle("a", "b", "c")
    before = _views(router, fleet)
    assert _views(router, fleet) == before  # the very same objects
    chosen = router.choose(req("t/x@1"), fleet).replica_id
    after = _views(router, fleet)
    assert after[chosen] is not before[chosen]
    assert after[chosen].num_queued == 1 and after[chosen].tier_of("t/x@1") is Tier.LOADING
    assert all(after[r] is before[r] for r in fleet if r != chosen)


def test_a_new_report_a_stale_report_and_a_dedication_each_rebuild_the_view() -> None:
    router, clock = make_router(max_report_age_s=2.0)
    fleet: dict[str, ReplicaReport | None] = dict(idle("a", "b"))
    first = _views(router, fleet)
    assert first["a"].tier_of("t/x@1") is Tier.ABSENT
    fleet["a"] = report("a", at_s=0.0, l1=["t/x@1"], queued=3)
    second = _views(router, fleet)
    assert second["a"] is not first["a"] and second["b"] is first["b"]
    assert second["a"].tier_of("t/x@1") is Tier.L1 and second["a"].num_queued == 3
    clock.advance(2.5)  # both reports are now too old
    third = _views(router, fleet)
    assert not third["a"].known and not third["b"].known
    assert third["a"].tier_of("t/x@1") is Tier.ABSENT and third["a"].num_queued == 0
    router.dedication = Dedication("b", "t/x@1")
    fourth = _views(router, fleet)
    assert fourth["b"] is not third["b"] and fourth["b"].is_merged("t/x@1")
    assert fourth["a"] is third["a"]


def test_decisions_lapsing_by_ttl_rebuild_the_view() -> None:
    router, clock = make_router(recent_ttl_s=1.0, max_report_age_s=100.0)
    fleet = idle("a", "b")
    chosen = router.choose(req("t/x@1"), fleet).replica_id
    held = _views(router, fleet)[chosen]
    assert held.pending.num_requests == 1
    clock.advance(1.5)
    lapsed = _views(router, fleet)[chosen]
    assert lapsed is not held and lapsed.pending.num_requests == 0
    assert lapsed.tier_of("t/x@1") is Tier.ABSENT


def test_a_replica_that_left_is_forgotten_and_a_returning_one_starts_afresh() -> None:
    router, _ = make_router()
    router.choose(req(), idle("a", "b"))
    gone = _views(router, idle("a", "b"))["b"]
    router.choose(req(), idle("a"))
    back = _views(router, idle("a", "b"))["b"]
    assert back is not gone


def test_a_long_lived_view_bounds_its_remembered_tiers() -> None:
    router, _ = make_router()
    fleet = {"a": report("a", l0=["t/hot@1"])}
    view = _views(router, fleet)["a"]
    for i in range(MAX_TIERS_CACHED + 10):
        assert view.tier_of(f"t/cold{i}@1") is Tier.ABSENT
    assert len(view.tiers) <= MAX_TIERS_CACHED
    assert view.tier_of("t/hot@1") is Tier.L0


def test_held_keys_join_the_exact_sets_and_give_up_on_a_bloom_filter() -> None:
    from loraplex.router.bloom import BloomFilter

    exact = report("a", l0=["k0"], l1=["k1"], l2=["k2"], loading=["k3"], pinned=["k4"])
    assert held_keys(exact) == {"k0", "k1", "k2", "k3"}  # pinned alone is not held
    assert held_keys(None) == frozenset()
    bloom = BloomFilter.of(["k1"], 0.01)
    fuzzy = ReplicaReport("a", 0.0, exact.residency.__class__(l1=bloom), exact.load)
    assert held_keys(fuzzy) is None


def _random_report(rng: random.Random, replica_id: str, at_s: float) -> ReplicaReport:
    keys = [f"t/a{i}@1" for i in range(12)]
    return report(
        replica_id,
        at_s=at_s,
        l0=rng.sample(keys, 2),
        l1=rng.sample(keys, 3),
        l2=rng.sample(keys, 2),
        loading=rng.sample(keys, 1),
        pinned=rng.sample(keys, 1),
        queued=rng.randrange(6),
        running=rng.randrange(12),
        tokens=rng.randrange(4000),
        kv=rng.random(),
        adapter_wait=rng.randrange(3),
        evictions=rng.random() * 4,
    )


def _traffic(
    rng: random.Random,
    routers: list[tuple[Router, ManualClock]],
    *,
    replicas: int,
    steps: int,
    dts: tuple[float, ...],
    report_chance: float,
    dedicate_every: int,
    sessions: tuple[str | None, ...],
) -> Iterator[tuple[int, dict[str, ReplicaReport | None], RouteRequest]]:
    """Random decisions' inputs for routers fed alike: time moves on their clocks, new reports
    come, a dedication changes now and then; yields (step, fleet, request) per decision."""
    ids = [f"r{i}" for i in range(replicas)]
    fleet: dict[str, ReplicaReport | None] = dict.fromkeys(ids)
    now = 0.0
    for step in range(steps):
        dt = rng.choice(dts)
        now += dt
        for _, clock in routers:
            clock.advance(dt)
        if rng.random() < report_chance:
            replica = rng.choice(ids)
            fleet[replica] = _random_report(rng, replica, now)
        if step % dedicate_every == 0:
            dedication = Dedication(rng.choice(ids), f"t/a{rng.randrange(12)}@1")
            for router, _ in routers:
                router.dedication = dedication
        key = None if rng.random() < 0.1 else f"t/a{rng.randrange(16)}@1"
        yield step, fleet, req(key, session=rng.choice(sessions), tokens=rng.randrange(1, 64))


def test_reused_views_decide_as_views_built_afresh_for_every_decision() -> None:
    """Two routers on the same seed see the same reports, clock and requests; one keeps its
    views, the other has them dropped before every decision. Every ranking is the same."""
    rng = random.Random(7)
    kept = make_router(seed=3, max_queued=4, max_ongoing=8, recent_ttl_s=0.4)
    fresh = make_router(seed=3, max_queued=4, max_ongoing=8, recent_ttl_s=0.4)
    reasons = set()
    traffic = _traffic(
        rng,
        [kept, fresh],
        replicas=6,
        steps=600,
        dts=(0.0, 0.0, 0.01, 0.05, 0.3),
        report_chance=0.15,
        dedicate_every=97,
        sessions=(None, "s1", "s2"),
    )
    for step, fleet, request in traffic:
        fresh[0]._views.clear()  # NOTE: private on purpose: the reference builds every view anew
        fresh[0]._held.clear()
        a, b = kept[0].choose(request, fleet), fresh[0].choose(request, fleet)
        assert a == b, f"decision {step}"
        reasons.add(a.reason)
    assert len(reasons) >= 5  # the sequence exercised most rules


def test_a_ranking_read_after_later_decisions_is_the_one_read_at_once() -> None:
    """``Decision.ranked`` past the first replica is sorted when first read: two routers making
    the same decisions, one reading each ranking at once and one reading them all at the end
    (after later decisions, a new report and time moved on), see the same rankings."""
    rng = random.Random(3)
    fleets = []
    for step in range(40):
        fleets.append(
            {
                r: report(
                    r,
                    at_s=float(step // 10),
                    l0=[f"t/a{rng.randrange(6)}@1"],
                    l1=[f"t/a{rng.randrange(6)}@1"],
                    queued=rng.randrange(12),
                    running=rng.randrange(40),
                )
                for r in ("a", "b", "c", "d", "e")
            }
        )
    keys = [None if rng.random() < 0.1 else f"t/a{rng.randrange(9)}@1" for _ in fleets]
    eager, eager_clock = make_router()
    lazy, lazy_clock = make_router()
    at_once, decisions = [], []
    for step, (fleet, key) in enumerate(zip(fleets, keys, strict=True)):
        eager_clock.advance(0.1 if step else 0.0)
        lazy_clock.advance(0.1 if step else 0.0)
        at_once.append(eager.choose(req(key), fleet).ranked)
        decisions.append(lazy.choose(req(key), fleet))
    late = [d.ranked for d in decisions]
    assert late == at_once
    assert len({r[1:] for r in late}) > 5  # the rankings past the first differ between decisions
    assert all(d.replica_id == r[0] for d, r in zip(decisions, late, strict=True))


def test_views_looked_at_in_part_decide_as_views_looked_at_in_full() -> None:
    """``Router.view`` looks only at the replicas whose view may have changed (a new report, the
    last decision's replica) until a report may turn stale or a decision lapse, and the policy
    keeps its known/open/holder flags per position (``FleetScan``). A reference router made to
    look at every replica and rescan the fleet before each decision ranks every request the same,
    through reports turning stale, decisions lapsing, dedications and replicas leaving and
    coming back."""
    from loraplex.router.view import FleetScan

    rng = random.Random(11)
    settings = {"max_queued": 4, "max_ongoing": 8, "recent_ttl_s": 0.4, "max_report_age_s": 0.7}
    kept = make_router(seed=5, **settings)  # type: ignore[arg-type]
    full = make_router(seed=5, **settings)  # type: ignore[arg-type]
    reasons = set()
    traffic = _traffic(
        rng,
        [kept, full],
        replicas=7,
        steps=1500,
        dts=(0.0, 0.0, 0.01, 0.05, 0.2, 0.45),
        report_chance=0.2,
        dedicate_every=131,
        sessions=(None, "s1"),
    )
    for step, fleet, request in traffic:
        offered = fleet
        if step % 200 > 190:  # a replica away for a few decisions
            offered = {r: v for r, v in fleet.items() if r != "r3"}
        full[0]._last = None  # NOTE: private on purpose: the reference looks at every replica
        full[0].policy._scan = FleetScan(full[0].config)  # type: ignore[attr-defined]
        a, b = kept[0].choose(request, offered), full[0].choose(request, offered)
        assert a == b, f"decision {step}"
        assert [v.replica_id for v in kept[0].view(offered)] == sorted(offered)
        reasons.add(a.reason)
    assert len(reasons) >= 5


def test_fleet_scan_lists_are_the_filters_they_stand_for() -> None:
    """``FleetScan``'s known, open and holders lists equal the per-view tests, as views change
    position by position (a Bloom filter's replica falls back to ``tier_of``)."""
    from loraplex.router import RouterConfig
    from loraplex.router.bloom import BloomFilter
    from loraplex.router.memory import NO_PENDING, Pending
    from loraplex.router.view import FleetScan, holders, utilization

    rng = random.Random(4)
    config = RouterConfig(max_queued=3, max_ongoing=6)
    scan = FleetScan(config)
    fleet: list[ReplicaView] = [
        ReplicaView(f"r{i}", None, NO_PENDING, None, frozenset()) for i in range(8)
    ]
    for _ in range(300):
        i = rng.randrange(len(fleet))
        replica_id = f"r{i}"
        rep = None if rng.random() < 0.2 else _random_report(rng, replica_id, 0.0)
        pending = NO_PENDING
        if rng.random() < 0.3:
            pending = Pending(1, 8, frozenset({f"t/a{rng.randrange(16)}@1"}))
        held = held_keys(rep)
        if rep is not None and rng.random() < 0.1:  # a Bloom filter: no joined set
            bloom = BloomFilter.of(rep.residency.l1, 0.01)
            rep = ReplicaReport(replica_id, 0.0, rep.residency.__class__(l1=bloom), rep.load)
            held = None
        fleet = [*fleet[:i], ReplicaView(replica_id, rep, pending, None, held), *fleet[i + 1 :]]
        scan.update(fleet)
        known = [v for v in fleet if v.report is not None]
        assert scan.known() == known
        assert scan.open() == [v for v in known if utilization(v, config) < 1.0]
        for k in range(16):
            key = f"t/a{k}@1"
            assert scan.holders(key) == holders(known, key)
