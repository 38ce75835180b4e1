"""Bounded placement: where a revision that is resident nowhere may be loaded.

Each revision has a fixed preference order over the replicas (rendezvous, or highest-random-
weight, hashing): replica r's weight for revision a is a hash of (a, r), and the order is by
weight. A cold revision goes to one of the first ``width`` replicas of its order (``width`` =
``placement_k`` normally), so the long tail of rarely used revisions is spread over the fleet but
each revision is copied to few replicas. A replica joining or leaving moves only the revisions
whose top entries it was.

When every replica of the set is saturated, the set widens by one; it narrows by one again only
once the narrower set is well below saturation (``narrow_below``), so a set at the threshold
does not flap.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import lru_cache

ORDERS_CACHED = 4096  # rendezvous orders remembered (revision x fleet), least recently used out


def rank_name(rank: int) -> str:
    """A replica's placement identity in a fleet: its deployment rank (0, 1, .. as Ray Serve
    assigns them, a replacement taking the rank of the replica it replaces), not its random id,
    so the same deployment places alike in every run (docs/fleet.md, "Placement identity").
    The simulator names its replicas so too."""
    return f"rank-{rank}"


def rendezvous_order(adapter_key: str, replica_ids: Sequence[str]) -> list[str]:
    """``replica_ids`` in ``adapter_key``'s fixed preference order (ties by id, for a total
    order)."""
    return list(_order(adapter_key, tuple(replica_ids)))


@lru_cache(maxsize=ORDERS_CACHED)
def _order(adapter_key: str, replica_ids: tuple[str, ...]) -> tuple[str, ...]:
    # NOTE: a pure function of its arguments, remembered: a revision placed again over the same
    # fleet costs one lookup instead of a hash per replica. Replica r's weight is the blake2b-64
    # of "{adapter_key}\0{r}" (the key encoded once: UTF-8 of a join is the join of the UTF-8s).
    prefix = adapter_key.encode() + b"\x00"
    weights = {
        r: int.from_bytes(hashlib.blake2b(prefix + r.encode(), digest_size=8).digest(), "big")
        for r in replica_ids
    }
    return tuple(sorted(replica_ids, key=lambda r: (-weights[r], r)))


class PlacementWidths:
    """How many replicas of its rendezvous order each recently widened revision may use.

    Only widened revisions are stored (the rest use ``placement_k``), least recently used first
    out past ``max_tracked``: a forgotten revision falls back to ``placement_k``, which is safe.
    """

    def __init__(self, placement_k: int, narrow_below: float, max_tracked: int) -> None:
        self._k = placement_k
        self._narrow_below = narrow_below
        self._max_tracked = max_tracked
        self._widths: OrderedDict[str, int] = OrderedDict()

    def width(self, adapter_key: str) -> int:
        """The current width of ``adapter_key``'s set (``placement_k`` unless widened)."""
        return self._widths.get(adapter_key, self._k)

    def update(
        self,
        adapter_key: str,
        order: Sequence[str],
        utilization: Callable[[str], float],
    ) -> int:
        """Narrows or widens ``adapter_key``'s set over ``order`` for the load now seen
        (``utilization`` of a replica id: 1.0 and above is saturated) and returns its width."""
        n = len(order)
        width = min(self.width(adapter_key), n)
        # Narrowing one at a time while the set but its last is calm ends at placement_k once
        # it starts (a shorter prefix stays calm); widening while the whole set is saturated
        # ends just past the first unsaturated replica of the order. Both in one pass.
        if width > self._k and all(
            utilization(r) <= self._narrow_below for r in order[: width - 1]
        ):
            width = self._k
        if width < n:
            first_open = next((i for i, r in enumerate(order) if utilization(r) < 1.0), n)
            if first_open >= width:
                width = min(first_open + 1, n)
        self._store(adapter_key, width)
        return width

    def _store(self, adapter_key: str, width: int) -> None:
        if width <= self._k:
            self._widths.pop(adapter_key, None)
            return
        self._widths[adapter_key] = width
        self._widths.move_to_end(adapter_key)
        while len(self._widths) > self._max_tracked:
            self._widths.popitem(last=False)


class _Reach:
    """One revision's reach and the timers of a change to it (None: not running)."""

    __slots__ = ("last_s", "narrow_since_s", "reach", "widen_since_s")

    def __init__(self) -> None:
        self.reach = 1
        self.widen_since_s: float | None = None  # since when its reach stayed saturated
        self.narrow_since_s: float | None = None  # since when it stayed calm enough to narrow
        self.last_s: float | None = None  # its last update


class Reaches:
    """How many replicas each revision may fill GPU slots on (its *reach*: 1 unless widened),
    for ``RouterConfig.spread_after_s`` (docs/router.md, rule 4).

    ``update`` is given the utilizations of the replicas within a revision's reach whenever
    the revision fills slots on that many. The reach widens by one once they have all been
    saturated (utilization >= 1) at every update for ``after_s``, and narrows by one once
    their utilizations have summed to at most ``narrow_below x (reach - 1)`` (the load would
    fit on one replica fewer, each below ``narrow_below``) for ``after_s``; between the two it
    stays (hysteresis). A revision not updated for ``after_s`` starts both timers afresh: a
    saturation seen once, long ago, is not a sustained one. Only revisions with a reach above
    1 or a timer running are stored, least recently used first out past ``max_tracked`` (a
    forgotten revision has reach 1 again, which is safe: it widens again if it must).
    """

    def __init__(self, after_s: float, narrow_below: float, max_tracked: int) -> None:
        self._after_s = after_s
        self._narrow_below = narrow_below
        self._max_tracked = max_tracked
        self._reaches: OrderedDict[str, _Reach] = OrderedDict()

    def reach(self, adapter_key: str) -> int:
        """``adapter_key``'s current reach (1 unless widened)."""
        state = self._reaches.get(adapter_key)
        return 1 if state is None else state.reach

    def update(
        self,
        adapter_key: str,
        utilizations: Sequence[float],
        now_s: float,
        *,
        can_widen: bool,
    ) -> int:
        """Takes the utilizations of the replicas within ``adapter_key``'s reach now and returns
        its reach (widened or narrowed by at most one); ``can_widen``: a replica outside the
        reach could take it (unsaturated), else saturation does not count toward widening."""
        state = self._reaches.get(adapter_key) or _Reach()
        after_s = self._after_s
        if state.last_s is not None and now_s - state.last_s > after_s:
            state.widen_since_s = state.narrow_since_s = None  # unobserved since: start again
        state.last_s = now_s
        if can_widen and utilizations and all(u >= 1.0 for u in utilizations):
            state.narrow_since_s = None
            if state.widen_since_s is None:
                state.widen_since_s = now_s
            if now_s - state.widen_since_s >= after_s:
                state.reach += 1
                state.widen_since_s = None
        elif state.reach > 1 and sum(utilizations) <= self._narrow_below * (state.reach - 1):
            state.widen_since_s = None
            if state.narrow_since_s is None:
                state.narrow_since_s = now_s
            if now_s - state.narrow_since_s >= after_s:
                state.reach -= 1
                state.narrow_since_s = None
        else:
            state.widen_since_s = state.narrow_since_s = None
        self._store(adapter_key, state)
        return state.reach

    def _store(self, adapter_key: str, state: _Reach) -> None:
        if state.reach == 1 and state.widen_since_s is None and state.narrow_since_s is None:
            self._reaches.pop(adapter_key, None)
            return
        self._reaches[adapter_key] = state
        self._reaches.move_to_end(adapter_key)
        while len(self._reaches) > self._max_tracked:
            self._reaches.popitem(last=False)
