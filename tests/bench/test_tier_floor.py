"""The L1/L2 reload floor (``bench/cache/tier_floor.py``): an LP relaxation over unions of
tiers, checked against an exhaustive search of which gaps a cache could hold."""

from __future__ import annotations

import itertools
import random
from collections.abc import Hashable, Mapping, Sequence

import pytest

from loraplex.bench.cache.belady import belady_misses
from loraplex.bench.cache.tier_floor import TierCapacity, union_floor

WINDOW_S = 50.0


def _best_recent_hits(
    arrivals: Sequence[tuple[float, Hashable]],
    sizes: Mapping[Hashable, int],
    tiers: Sequence[TierCapacity],
) -> int:
    """Exhaustive: every assignment of each recent gap to a tier or to none, feasible when
    every tier's held gaps fit between requests and, in a slot tier, beside the requested
    adapter's own slot at each request. The integer optimum the LP relaxes."""
    last: dict[Hashable, int] = {}
    gaps = []
    for j, (t_s, k) in enumerate(arrivals):
        if k in last and t_s - arrivals[last[k]][0] <= WINDOW_S:
            gaps.append((last[k], j, k))
        last[k] = j
    best = 0
    for choice in itertools.product(range(len(tiers) + 1), repeat=len(gaps)):
        fits = True
        for j in range(len(arrivals)):
            for t, tier in enumerate(tiers):
                used = sum(
                    1 if tier.per_slot else sizes[k]
                    for (s, e, k), c in zip(gaps, choice, strict=True)
                    if c == t + 1 and s <= j < e
                )
                across = sum(
                    1 for (s, e, _), c in zip(gaps, choice, strict=True) if c == t + 1 and s < j < e
                )
                fits = fits and used <= tier.capacity
                fits = fits and (not tier.per_slot or across + 1 <= tier.capacity)
        if fits:
            best = max(best, sum(1 for c in choice if c))
    return best


def _random_trace(rng: random.Random, n: int) -> list[tuple[float, Hashable]]:
    t, out = 0.0, []
    for _ in range(n):
        t += rng.choice((1.0, 5.0, 30.0))
        out.append((t, rng.randrange(4)))
    return out


def test_the_floor_never_exceeds_the_exhaustive_optimum() -> None:
    rng = random.Random(0)
    sizes = {0: 1, 1: 2, 2: 3, 3: 1}
    for _ in range(25):
        arrivals = _random_trace(rng, rng.randrange(3, 9))
        tiers = [TierCapacity(1, per_slot=True), TierCapacity(rng.randrange(0, 5), per_slot=False)]
        bound = union_floor(arrivals, sizes, tiers, WINDOW_S)
        best = _best_recent_hits(arrivals, sizes, tiers)
        assert bound.max_recent_hits >= best, (arrivals, tiers)
        assert bound.reload_floor == bound.recent_returns - bound.max_recent_hits >= 0


def test_with_unit_sizes_in_one_tier_it_is_exact() -> None:
    """Slots only: the interval LP is integral, so the floor is the optimum; on a trace with
    every return recent that is Belady's misses less the first requests."""
    rng = random.Random(1)
    for _ in range(25):
        keys = [rng.randrange(5) for _ in range(rng.randrange(2, 9))]
        arrivals = [(float(i), k) for i, k in enumerate(keys)]
        capacity = rng.randrange(1, 4)
        bound = union_floor(arrivals, {}, [TierCapacity(capacity, per_slot=True)], WINDOW_S)
        assert bound.reload_floor == belady_misses(keys, capacity) - len(set(keys)), keys


def test_returns_after_the_window_are_not_counted() -> None:
    # One slot, a and b alternating: each request takes the slot, so both recent returns miss
    # (as Belady's floor says); a's return at t=100 is 99 s after its previous request.
    arrivals = [(0.0, "a"), (0.5, "b"), (1.0, "a"), (1.5, "b"), (100.0, "a")]
    bound = union_floor(arrivals, {}, [TierCapacity(1, per_slot=True)], WINDOW_S)
    assert (bound.recent_returns, bound.max_recent_hits, bound.reload_floor) == (2, 0, 2)
    assert bound.reload_floor_per_1k == pytest.approx(400.0)


def test_a_byte_tier_holds_by_bytes_and_in_part() -> None:
    """s (1 byte) and b (2 bytes) alternate in a byte tier: 3 bytes hold both (all 6 recent
    returns hit); 2 bytes hold s and, in the relaxation, half of b: 3 + 1.5 hits, 4 rounded
    down (an integer cache holds s only: 3). The floor stays below what any cache gets."""
    arrivals = [(float(i), k) for i, k in enumerate(["s", "b"] * 4)]
    sizes = {"s": 1, "b": 2}
    for capacity, hits in ((3, 6), (2, 4)):
        tiers = [TierCapacity(0, per_slot=True), TierCapacity(capacity, per_slot=False)]
        bound = union_floor(arrivals, sizes, tiers, WINDOW_S)
        assert (bound.recent_returns, bound.max_recent_hits) == (6, hits)


def test_a_negative_capacity_is_refused() -> None:
    with pytest.raises(ValueError, match="tiers"):
        union_floor([(0.0, "a")], {}, [TierCapacity(-1, per_slot=True)], WINDOW_S)
