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
