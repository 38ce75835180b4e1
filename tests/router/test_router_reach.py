"""Rule 4 with a reach (``RouterConfig.spread_after_s``): a revision fills GPU slots on at most
its reach of replicas, 1 at first; it waits at those (``reach_full``) while they are saturated,
spreads to one more only once they stayed saturated for ``spread_after_s``, and narrows back
with hysteresis. Off (0) by default: rule 4 spreads at the first saturation, as before."""

from __future__ import annotations

import pytest
from router_kit import idle, make_router, report, req

from loraplex.router import Reason, ReplicaReport, RouterConfig
from loraplex.router.placement import Reaches, rendezvous_order

HOT = "t/hot@1"
REPLICAS = ["r0", "r1", "r2"]


def test_reaches_widen_only_after_sustained_saturation() -> None:
    reaches = Reaches(after_s=1.0, narrow_below=0.5, max_tracked=10)
    assert reaches.update("k", [1.0], 0.0, can_widen=True) == 1  # saturated: the timer starts
    assert reaches.update("k", [1.5], 0.5, can_widen=True) == 1
    assert reaches.update("k", [0.9], 0.9, can_widen=True) == 1  # open once: it starts again
    assert reaches.update("k", [1.0], 1.0, can_widen=True) == 1
    assert reaches.update("k", [1.0], 1.9, can_widen=True) == 1
    assert reaches.update("k", [1.0], 2.0, can_widen=True) == 2  # saturated for 1 s: widened
    assert reaches.reach("k") == 2
    assert reaches.reach("other") == 1


def test_reaches_do_not_widen_where_no_replica_could_take_it() -> None:
    reaches = Reaches(after_s=1.0, narrow_below=0.5, max_tracked=10)
    for t in (0.0, 0.5, 1.0, 1.5, 2.0):
        assert reaches.update("k", [2.0], t, can_widen=False) == 1


def test_reaches_forget_a_saturation_not_seen_since() -> None:
    """A revision routed once while saturated and again 10 s later has not been saturated for
    10 s as far as the router knows: its timer starts again."""
    reaches = Reaches(after_s=1.0, narrow_below=0.5, max_tracked=10)
    assert reaches.update("k", [1.0], 0.0, can_widen=True) == 1
    assert reaches.update("k", [1.0], 10.0, can_widen=True) == 1
    assert reaches.update("k", [1.0], 11.0, can_widen=True) == 2


def test_reaches_narrow_only_when_the_load_fits_one_replica_fewer_for_long_enough() -> None:
    reaches = Reaches(after_s=1.0, narrow_below=0.5, max_tracked=10)
    reaches.update("k", [1.0], 0.0, can_widen=True)
    assert reaches.update("k", [1.0], 1.0, can_widen=True) == 2
    # Between the thresholds: 0.3 + 0.3 would be 0.6 on one replica, above narrow_below.
    for t in (2.0, 3.0, 4.0, 5.0):
        assert reaches.update("k", [0.3, 0.3], t, can_widen=True) == 2
    # 0.2 + 0.2 fits one replica at 0.4: narrows once that held for 1 s.
    assert reaches.update("k", [0.2, 0.2], 6.0, can_widen=True) == 2
    assert reaches.update("k", [0.3, 0.2], 6.5, can_widen=True) == 2
    assert reaches.update("k", [0.2, 0.2], 7.0, can_widen=True) == 1
    assert reaches.reach("k") == 1


def test_reaches_widen_one_at_a_time_to_the_fleet() -> None:
    reaches = Reaches(after_s=1.0, narrow_below=0.5, max_tracked=10)
    got = [reaches.update("k", [1.0] * reaches.reach("k"), t / 2, can_widen=True) for t in range(9)]
    assert got == [1, 1, 2, 2, 2, 3, 3, 3, 4]


def test_reaches_are_bounded() -> None:
    reaches = Reaches(after_s=1.0, narrow_below=0.5, max_tracked=2)
    for key in ("a", "b", "c"):
        reaches.update(key, [1.0], 0.0, can_widen=True)
        reaches.update(key, [1.0], 1.0, can_widen=True)
    assert [reaches.reach(k) for k in ("a", "b", "c")] == [1, 2, 2]  # "a" forgotten: reach 1


def _fleet(at_s: float, hot_on: dict[str, int]) -> dict[str, ReplicaReport | None]:
    """Every replica idle but those in ``hot_on``, which hold the hot revision in GPU slots
    with that many requests queued (8: saturated)."""
    reports = idle(*REPLICAS, at_s=at_s)
    for r, queued in hot_on.items():
        reports[r] = report(r, at_s=at_s, l0=[HOT], queued=queued)
    return reports


def test_off_by_default_rule_4_spreads_at_the_first_saturation() -> None:
    assert RouterConfig().spread_after_s == 0.0
    router, _ = make_router()
    decision = router.choose(req(HOT), _fleet(0.0, {"r0": 8}))
    assert decision.reason is Reason.SATURATED
    assert decision.replica_id != "r0"


def test_a_saturated_holder_keeps_its_revision_until_the_saturation_lasts() -> None:
    router, clock = make_router(spread_after_s=1.0)
    # The holder open: rule 3 as always.
    decision = router.choose(req(HOT), _fleet(0.0, {"r0": 2}))
    assert (decision.replica_id, decision.reason) == ("r0", Reason.GPU_HIT)
    # Saturated: it waits there instead of loading into another replica's slots ...
    clock.advance(0.5)
    decision = router.choose(req(HOT), _fleet(0.5, {"r0": 8}))
    assert (decision.replica_id, decision.reason) == ("r0", Reason.REACH_FULL)
    clock.advance(0.5)
    decision = router.choose(req(HOT), _fleet(1.0, {"r0": 8}))
    assert (decision.replica_id, decision.reason) == ("r0", Reason.REACH_FULL)
    # ... until it has been saturated for spread_after_s: then rule 4 gives it a new holder.
    clock.advance(0.5)
    decision = router.choose(req(HOT), _fleet(1.5, {"r0": 8}))
    assert decision.reason is Reason.SATURATED
    assert decision.replica_id in {"r1", "r2"}
    second = decision.replica_id
    # With both holders in its reach saturated it waits at the better one, not a third.
    clock.advance(0.1)
    decision = router.choose(req(HOT), _fleet(1.6, {"r0": 9, second: 8}))
    assert (decision.replica_id, decision.reason) == (second, Reason.REACH_FULL)


def test_a_widened_reach_narrows_to_the_first_holder_in_its_rendezvous_order() -> None:
    first, second, _ = rendezvous_order(HOT, REPLICAS)
    router, clock = make_router(spread_after_s=1.0)
    router.choose(req(HOT), _fleet(0.0, {first: 8}))
    clock.advance(1.0)
    assert router.choose(req(HOT), _fleet(1.0, {first: 8})).reason is Reason.SATURATED
    # Both hold it, between the thresholds (3 + 3 queued would be 0.75 of saturation on one
    # replica, above narrow_below): it stays on both, the less loaded first, never a third.
    for i in range(6):
        clock.advance(0.5)
        loads = {first: 3, second: 2} if i % 2 else {first: 2, second: 3}
        decision = router.choose(req(HOT), _fleet(clock.now(), loads))
        assert decision.reason is Reason.GPU_HIT
        assert decision.replica_id == min(loads, key=loads.__getitem__)
    # Calm (1 + 0 queued: 0.125 of saturation together), the second the less loaded: it is
    # used until the calm has lasted 1 s, then the reach narrows to the first in its order.
    chosen = []
    for _ in range(4):
        clock.advance(0.5)
        chosen.append(router.choose(req(HOT), _fleet(clock.now(), {first: 1, second: 0})))
    assert [d.replica_id for d in chosen] == [second, second, first, first]
    # Its first holder saturated again: it waits there, the second is out of its reach now.
    clock.advance(0.5)
    decision = router.choose(req(HOT), _fleet(clock.now(), {first: 8, second: 0}))
    assert (decision.replica_id, decision.reason) == (first, Reason.REACH_FULL)


def test_spread_after_s_is_validated() -> None:
    for bad in (-1.0, float("nan"), "1"):
        with pytest.raises(ValueError, match="spread_after_s"):
            RouterConfig(spread_after_s=bad)  # type: ignore[arg-type]
