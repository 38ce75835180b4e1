"""Bounded placement: a cold revision goes to its rendezvous top k, widens when they are all
saturated and narrows again only well below saturation."""

from __future__ import annotations

from collections import Counter

from router_kit import idle, make_router, report, req

from loraplex.router import Reason, ReplicaReport
from loraplex.router.placement import PlacementWidths, rendezvous_order

REPLICAS = [f"r{i}" for i in range(6)]


def test_cold_revisions_go_to_their_top_k_and_spread_over_the_fleet() -> None:
    fleet = idle(*REPLICAS)
    used: Counter[str] = Counter()
    for i in range(300):
        key = f"t/cold-{i}@1"
        router, _ = make_router()  # fresh memory: every replica equally idle
        decision = router.choose(req(key), fleet)
        assert decision.reason is Reason.PLACEMENT
        assert decision.replica_id in rendezvous_order(key, REPLICAS)[:2]
        used[decision.replica_id] += 1
    # The long tail is spread: every replica gets a fair share (300 / 6 = 50 each on average).
    assert set(used) == set(REPLICAS)
    assert min(used.values()) >= 25


def test_placement_prefers_the_less_loaded_of_the_set() -> None:
    key = "t/cold@1"
    first, second = rendezvous_order(key, REPLICAS)[:2]
    fleet = idle(*REPLICAS)
    fleet[first] = report(first, queued=3)
    router, _ = make_router()
    assert router.choose(req(key), fleet).replica_id == second


def test_rendezvous_order_moves_little_when_a_replica_leaves() -> None:
    keys = [f"t/k{i}@1" for i in range(200)]
    before = {k: rendezvous_order(k, REPLICAS)[0] for k in keys}
    after = {k: rendezvous_order(k, REPLICAS[:-1])[0] for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved  # some were on the replica that left ...
    assert all(before[k] == REPLICAS[-1] for k in moved)  # ... and only those moved


def test_widening_when_the_set_saturates_and_narrowing_with_hysteresis() -> None:
    key = "t/cold@1"
    order = rendezvous_order(key, REPLICAS)
    router, clock = make_router()

    def fleet(queued_top2: int, at_s: float) -> dict[str, ReplicaReport | None]:
        reports = idle(*REPLICAS, at_s=at_s)
        for r in order[:2]:
            reports[r] = report(r, at_s=at_s, queued=queued_top2)
        return reports

    decision = router.choose(req(key), fleet(8, 0.0))  # the top 2 saturated: widen to 3
    assert (decision.replica_id, decision.reason) == (order[2], Reason.WIDENED)
    # Between narrow_below (0.5 → 4 queued) and saturation: stays wide (hysteresis).
    clock.advance(1.0)
    decision = router.choose(req(key), fleet(6, 1.0))
    assert decision.reason is Reason.WIDENED
    assert decision.replica_id == order[2]
    # Well below saturation: narrows back to the top 2.
    clock.advance(1.0)
    decision = router.choose(req(key), fleet(2, 2.0))
    assert decision.reason is Reason.PLACEMENT
    assert decision.replica_id in order[:2]


def test_widths_widen_to_the_first_unsaturated_and_narrow_only_when_calm() -> None:
    order = ["a", "b", "c", "d"]
    load = {"a": 1.0, "b": 1.0, "c": 1.0, "d": 0.0}
    widths = PlacementWidths(placement_k=2, narrow_below=0.5, max_tracked=10)
    assert widths.update("x", order, load.__getitem__) == 4
    load.update(a=0.2, b=0.2, c=0.7)  # c is not calm: the set keeps d
    assert widths.update("x", order, load.__getitem__) == 4
    load.update(c=0.1)
    assert widths.update("x", order, load.__getitem__) == 2
    assert widths.width("x") == 2
    assert widths.update("y", ["a"], load.__getitem__) == 1  # fewer replicas than k


def test_widened_entries_are_bounded() -> None:
    widths = PlacementWidths(placement_k=1, narrow_below=0.5, max_tracked=3)
    for i in range(10):
        widths.update(f"k{i}", ["a", "b"], {"a": 1.0, "b": 0.0}.__getitem__)
    assert [widths.width(f"k{i}") for i in range(10)] == [1] * 7 + [2] * 3


def test_rendezvous_order_is_by_the_blake2b_of_key_and_replica() -> None:
    """The weight every fleet member computes alike (a replica's place must not depend on
    which process ranks): blake2b-64 of "key\\0replica", highest first, ties by id."""
    import hashlib

    key, replicas = "tenant-ü/a@1", [f"replica-{i:03d}" for i in range(9)]

    def weight(r: str) -> int:
        digest = hashlib.blake2b(f"{key}\x00{r}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big")

    assert rendezvous_order(key, replicas) == sorted(replicas, key=lambda r: (-weight(r), r))
