"""A lower bound on L1 and L2 reloads for ``bench residency``: how few refills of the CPU and
disk tiers any policy could have on a trace (Belady's L0 floor, ``belady.py``, covers L0).

Why a union: every request is served from an L0 copy, and fills go one tier at a time (L3 ->
L2 -> L1 -> L0), so a request that finds no copy in L0..Lk fills Lk. Such misses of the union
``U_k`` = L0 + .. + Lk are therefore a floor on Lk's fills. In a replay nothing fills a tier
between two requests of an adapter (no prefetch), so its set of tiers only shrinks there: it is
still in ``U_k`` at its next request iff one tier of ``U_k`` held it over the whole gap.

The bound is the linear relaxation of that problem (FOO's idea, Berger et al., SIGMETRICS '18,
with one capacity per tier): for every gap between two requests of an adapter, a hit fraction
``h`` no greater than the sum of the fractions ``y_t`` it is held in each tier ``t``; at every
instant the held gaps fit each tier (L0: slots; L1, L2: bytes), and at each request the
requested adapter takes an L0 slot beside the gaps held across it. Maximising the hits of the gaps
that end in a *recent* return (previous request at most ``reload_window_s`` back) bounds them
from above; the rest are recent misses, each an Lk fill of an adapter requested within the
window: what the cache counts as a reload after eviction, except when a policy had dropped that
tier's copy more than the window earlier while L0 (or, for L2, L0 and L1) kept the adapter.
Like the L0 floor it is played on the arrivals alone: loads are instantaneous, no slot is held
by a request in flight. No real policy fills less; the cache's reload counter can fall below
the floor only by the exception above (the replay tests check it does not).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from loraplex.residency.cache import CacheConfig
from loraplex.residency.ledger import Tier

_MIB = float(1 << 20)  # bytes are scaled to MiB: the solver's tolerances are absolute
K = TypeVar("K", bound=Hashable)  # an adapter's key in the trace


@dataclass(frozen=True)
class TierCapacity:
    """One tier of a union: how much it holds and what one adapter costs it."""

    capacity: float  # slots (L0) or bytes (L1, L2)
    per_slot: bool  # True: every adapter costs 1 (GPU slots); False: its size in bytes


@dataclass(frozen=True)
class UnionFloor:
    """The bound for one union of tiers on one trace."""

    num_requests: int  # requests of the trace
    recent_returns: int  # requests whose adapter was requested at most the window before
    max_recent_hits: int  # the relaxation's most hits among them (rounded down)

    @property
    def reload_floor(self) -> int:
        return self.recent_returns - self.max_recent_hits

    @property
    def reload_floor_per_1k(self) -> float:
        return 1000 * self.reload_floor / self.num_requests if self.num_requests else 0.0


def tier_floors(
    arrivals: Sequence[tuple[float, K]], sizes: Mapping[K, int], config: CacheConfig
) -> dict[str, float]:
    """The floors of L1 and L2 reloads per 1k requests at ``config``'s budgets. For L2 the two
    byte tiers are merged into one of their summed bytes (a copy held in either counts once): a
    further relaxation, so still a floor, and an LP of two capacities instead of three (the
    three-capacity LP did not solve within ten minutes on a 600 s trace)."""
    l0 = TierCapacity(float(config.budgets[Tier.L0].num_slots or 0), per_slot=True)
    l1_bytes = float(config.budgets[Tier.L1].capacity_bytes)
    l2_bytes = float(config.budgets[Tier.L2].capacity_bytes)
    window = config.reload_window_s
    l1 = union_floor(arrivals, sizes, [l0, TierCapacity(l1_bytes, False)], window)
    l2 = union_floor(arrivals, sizes, [l0, TierCapacity(l1_bytes + l2_bytes, False)], window)
    return {
        "reloads_per_1k_l1": l1.reload_floor_per_1k,
        "reloads_per_1k_l2": l2.reload_floor_per_1k,
    }


def union_floor(
    arrivals: Sequence[tuple[float, K]],
    sizes: Mapping[K, int],
    tiers: Sequence[TierCapacity],
    reload_window_s: float,
) -> UnionFloor:
    """The floor on fills of the deepest of ``tiers`` (L0 first) after a recent request."""
    if not tiers or any(not t.capacity >= 0 for t in tiers):
        raise ValueError(f"tiers {list(tiers)} is invalid; expected capacities >= 0")
    gaps = _recent_gaps(arrivals, reload_window_s)
    if not gaps:
        return UnionFloor(len(arrivals), 0, 0)
    hits = _max_hits(arrivals, gaps, sizes, tiers)
    # The LP's optimum bounds the integer one; the slack absorbs the solver's tolerance.
    return UnionFloor(len(arrivals), len(gaps), min(len(gaps), math.floor(hits + 1e-6)))


def _recent_gaps(
    arrivals: Sequence[tuple[float, Hashable]], reload_window_s: float
) -> list[tuple[int, int]]:
    """(start request, end request) of every gap that ends in a recent return."""
    last: dict[Hashable, tuple[int, float]] = {}
    gaps = []
    for j, (t_s, key) in enumerate(arrivals):
        previous = last.get(key)
        if previous is not None and t_s - previous[1] <= reload_window_s:
            gaps.append((previous[0], j))
        last[key] = (j, t_s)
    return gaps


def _max_hits(
    arrivals: Sequence[tuple[float, K]],
    gaps: Sequence[tuple[int, int]],
    sizes: Mapping[K, int],
    tiers: Sequence[TierCapacity],
) -> float:
    """The LP: variables h_g (hit of gap g), y_{g,t} (g held in tier t), then the load of tier
    t after request j. Rows: h_g <= sum_t y_{g,t}; per tier, load after j = load after j - 1 +
    gaps starting at j - gaps ending at j (cumulative form: 3 entries a row instead of one per
    held gap); and in a slot tier the requested adapter takes a slot itself at its request,
    beside the gaps held across it (load after j less the gap starting at j <= slots - 1)."""
    n, g, k = len(arrivals), len(gaps), len(tiers)
    layout = _Layout(n, g, k)
    ub: _Rows = ([], [], [])
    for i in range(g):
        ub_row = [(layout.hit(i), 1.0)] + [(layout.held(i, t), -1.0) for t in range(k)]
        _add(ub, i, ub_row)
    b_ub = [0.0] * g
    starts = {start: i for i, (start, _) in enumerate(gaps)}
    for t, tier in enumerate(tiers):
        if not tier.per_slot or tier.capacity < 1:
            continue
        for j in range(n):
            row = [(layout.load(t, j), 1.0)]
            if j in starts:
                row.append((layout.held(starts[j], t), -1.0))
            _add(ub, len(b_ub), row)
            b_ub.append(tier.capacity - 1)
    eq: _Rows = ([], [], [])
    for t, tier in enumerate(tiers):
        for j in range(n):
            _add(
                eq,
                t * n + j,
                [(layout.load(t, j), 1.0)] + ([(layout.load(t, j - 1), -1.0)] if j else []),
            )
        for i, (start, end) in enumerate(gaps):
            cost = 1.0 if tier.per_slot else sizes[arrivals[start][1]] / _MIB
            _add(eq, t * n + start, [(layout.held(i, t), -cost)])
            _add(eq, t * n + end, [(layout.held(i, t), cost)])
    caps = [t.capacity if t.per_slot else t.capacity / _MIB for t in tiers]
    bounds = [(0.0, 1.0)] * layout.first_load + [(0.0, caps[t]) for t in range(k) for _ in range(n)]
    objective = np.zeros(layout.size)
    objective[:g] = -1.0
    result = linprog(
        objective,
        A_ub=_matrix(ub, len(b_ub), layout.size),
        b_ub=np.array(b_ub),
        A_eq=_matrix(eq, n * k, layout.size),
        b_eq=np.zeros(n * k),
        bounds=bounds,
        method="highs-ipm",
    )
    if result.status != 0:
        raise RuntimeError(f"the tier-floor LP did not solve: {result.message}")
    return float(-result.fun)


# A sparse matrix being built: (rows, columns, values).
_Rows = tuple[list[int], list[int], list[float]]


def _add(rows: _Rows, row: int, entries: list[tuple[int, float]]) -> None:
    for column, value in entries:
        rows[0].append(row)
        rows[1].append(column)
        rows[2].append(value)


def _matrix(rows: _Rows, num_rows: int, num_columns: int) -> Any:
    return coo_matrix((rows[2], (rows[0], rows[1])), shape=(num_rows, num_columns)).tocsr()


@dataclass(frozen=True)
class _Layout:
    """Where each LP variable sits: hits, then holdings (gap-major), then tier loads."""

    n: int  # requests
    g: int  # recent gaps
    k: int  # tiers

    def hit(self, i: int) -> int:
        return i

    def held(self, i: int, t: int) -> int:
        return self.g + i * self.k + t

    @property
    def first_load(self) -> int:
        return self.g + self.g * self.k

    def load(self, t: int, j: int) -> int:
        return self.first_load + t * self.n + j

    @property
    def size(self) -> int:
        return self.first_load + self.n * self.k
