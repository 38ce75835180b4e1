"""The offline-optimal reference for ``bench residency``: how few L0 reloads any policy could
have on a trace at a slot count.

Belady's rule (evict the resident whose next request is farthest away; MIN, 1966) gives the
fewest misses of any eviction policy on a known request sequence with unit-size entries, which
GPU slots are. Played on the arrivals alone, without the slots that in-flight requests hold
(a real policy may not evict those), it is a relaxation: no policy on the real cache misses
less. A reload after eviction is a miss on an adapter that was evicted at most
``reload_window_s`` earlier; every miss is either an adapter's first request, or a return
after its previous request lies more than the window back (only then can its eviction be
that old), or a reload. So ``belady misses - first requests - returns after the window`` is a
lower bound on any policy's L0 reloads: if LRU's count is under twice this bound, no policy
can halve it.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class OptimalReloads:
    """Belady's figures on one trace at one capacity."""

    num_requests: int  # requests of the trace
    misses: int  # Belady's misses (first requests included)
    first_requests: int  # distinct adapters: misses no policy avoids
    late_returns: int  # requests whose adapter's previous request lies beyond the window
    reload_floor: int  # misses - first requests - late returns, at least 0

    @property
    def reload_floor_per_1k(self) -> float:
        return 1000 * self.reload_floor / self.num_requests if self.num_requests else 0.0


def belady_misses(keys: Sequence[Hashable], capacity: int) -> int:
    """Misses of the offline-optimal policy on ``keys`` with ``capacity`` unit-size entries."""
    if capacity < 1:
        raise ValueError(f"capacity {capacity} is invalid; expected >= 1")
    never = len(keys)
    next_use = [never] * len(keys)
    seen: dict[Hashable, int] = {}
    for i in range(len(keys) - 1, -1, -1):
        next_use[i] = seen.get(keys[i], never)
        seen[keys[i]] = i
    resident: dict[Hashable, int] = {}  # key -> its next use
    farthest: list[tuple[int, int]] = []  # (-next use, position): lazy max-heap over resident
    misses = 0
    for i, key in enumerate(keys):
        if key not in resident:
            misses += 1
            if len(resident) == capacity:
                _evict_farthest(resident, farthest, keys)
        resident[key] = next_use[i]
        heapq.heappush(farthest, (-next_use[i], i))
    return misses


def _evict_farthest(
    resident: dict[Hashable, int], farthest: list[tuple[int, int]], keys: Sequence[Hashable]
) -> None:
    """Pop heap entries until one is still current (its key resident with that next use)."""
    while True:
        negative_next, position = heapq.heappop(farthest)
        key = keys[position]
        if resident.get(key) == -negative_next:
            del resident[key]
            return


def optimal_reloads(
    arrivals: Sequence[tuple[float, Hashable]], capacity: int, reload_window_s: float
) -> OptimalReloads:
    """Belady's lower bound on reloads after eviction for ``arrivals`` ((time, key), in time
    order) with ``capacity`` slots; see the module docstring for why it bounds every policy."""
    keys = [key for _, key in arrivals]
    last_s: dict[Hashable, float] = {}
    late = 0
    for t_s, key in arrivals:
        previous = last_s.get(key)
        if previous is not None and t_s - previous > reload_window_s:
            late += 1
        last_s[key] = t_s
    misses = belady_misses(keys, capacity)
    floor = max(0, misses - len(last_s) - late)
    return OptimalReloads(len(keys), misses, len(last_s), late, floor)
