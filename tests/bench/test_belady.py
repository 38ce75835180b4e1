"""Belady's offline-optimal reference (``bench/cache/belady.py``): fewest misses of any eviction
choice, and a reload floor that only counts what no policy can avoid."""

from __future__ import annotations

import functools
import random
from collections.abc import Hashable, Sequence

import pytest

from loraplex.bench.cache.belady import belady_misses, optimal_reloads


def _fewest_misses(keys: Sequence[Hashable], capacity: int) -> int:
    """Exhaustive search over every eviction choice (tiny sequences only)."""

    @functools.cache
    def best(i: int, resident: frozenset[Hashable]) -> int:
        if i == len(keys):
            return 0
        key = keys[i]
        if key in resident:
            return best(i + 1, resident)
        if len(resident) < capacity:
            return 1 + best(i + 1, resident | {key})
        return 1 + min(best(i + 1, (resident - {victim}) | {key}) for victim in resident)

    return best(0, frozenset())


def test_belady_matches_an_exhaustive_search_on_random_sequences() -> None:
    rng = random.Random(0)
    for _ in range(60):
        keys = [rng.randrange(6) for _ in range(rng.randrange(1, 14))]
        capacity = rng.randrange(1, 5)
        assert belady_misses(keys, capacity) == _fewest_misses(keys, capacity), (keys, capacity)


def test_belady_beats_lru_on_a_cyclic_sweep() -> None:
    # LRU with 3 slots misses every request of a 4-key cycle; Belady keeps two of three.
    keys = [0, 1, 2, 3] * 5
    assert belady_misses(keys, 3) < len(keys)
    assert belady_misses(keys, 4) == 4  # only first requests miss when everything fits


def test_the_reload_floor_drops_first_requests_and_returns_after_the_window() -> None:
    # One slot, a and b alternating: every request misses; 2 are first requests, the return
    # of a at t=100 comes 99 s after its previous request (beyond a 50 s window).
    arrivals = [(0.0, "a"), (0.5, "b"), (1.0, "a"), (1.5, "b"), (100.0, "a")]
    bound = optimal_reloads(arrivals, 1, reload_window_s=50.0)
    assert (bound.misses, bound.first_requests, bound.late_returns) == (5, 2, 1)
    assert bound.reload_floor == 2 and bound.reload_floor_per_1k == pytest.approx(400.0)


def test_a_capacity_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity 0"):
        belady_misses(["a"], 0)
