"""One tier's victims in the policy's exact order, without ranking every copy per placement.

Torch-free; runs under the cache's lock. Sorting every evictable copy on each placement costs
O(copies log copies); this index keeps a heap of lower bounds ("floors") of each copy's order key
that hold until a horizon, and a query pops copies by floor into a small heap keyed by their
true key at ``now``, yielding its minimum once no floor left in the index is below it (bound and
refine). The order is exactly the policy's sort of every evictable copy, while a placement
computes true keys only for copies whose floor falls below the victims it takes.

A copy's floor is recomputed at the next query after ``note`` says its order inputs changed (a
request, a footprint, the copy reserved or removed); readiness, leases and pins are not in the
key, so such copies stay indexed and are skipped when met. Every floor is recomputed when the
horizon passed or after ``invalidate`` (inputs of every copy changed), and only when a query
needs the order: a tier with free room never pays for it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from typing import Protocol

from loraplex.artifacts.identity import AdapterKey
from loraplex.residency.ledger import ResidentEntry, Tier
from loraplex.residency.ledger import require_invariant as require
from loraplex.residency.policy import Candidate, EvictionPolicy, OrderKey

# (order key or its floor, sequence number, adapter key): unique, so items never tie.
_Item = tuple[OrderKey, int, AdapterKey]
# Stale heap items (superseded floors) tolerated per live one before the heap is compacted.
_STALE_PER_LIVE = 2
_STALE_SLACK = 64
# Floors price copies at a ceiling this factor above the source tier's bandwidth estimate; the
# ceiling is reset once the estimate leaves (ceiling / _BANDWIDTH_BAND, ceiling]. Noise in the
# measured fills then rarely rebuilds the order, and floors stay within a factor of the truth.
_BANDWIDTH_HEADROOM = 2.0
_BANDWIDTH_BAND = 4.0


class VictimOrder(Protocol):
    """How the index reads one tier's copies (``TierState`` through its policy)."""

    def key(self, entry: ResidentEntry, now_s: float) -> OrderKey:
        """The copy's true order key at ``now_s``."""
        ...

    def floor(self, entry: ResidentEntry, now_s: float, until_s: float) -> OrderKey:
        """A key no greater than ``key(entry, t)`` for every t in [now_s, until_s] while the
        copy's order inputs do not change."""
        ...


class VictimIndex:
    """Floors of one tier's copies; ``ranked`` yields its evictable copies in exact order."""

    def __init__(
        self,
        entries: Mapping[AdapterKey, ResidentEntry],
        order: VictimOrder,
        horizon_s: float,
    ) -> None:
        self._entries = entries  # the tier ledger's entries (read only)
        self._order = order
        self.horizon_s = horizon_s
        self._heap: list[_Item] = []
        self._live: dict[AdapterKey, int] = {}  # key -> sequence number of its current floor
        self._dirty: set[AdapterKey] = set()  # keys whose floor is recomputed at the next query
        self._borrowed: list[_Item] = []  # popped by the last query: back in the heap next time
        self._until_s: float | None = None  # the floors hold until then; None: not built
        self._seq = 0
        self._query = 0  # number of the latest query (an older iterator must not go on)

    def note(self, key: AdapterKey, now_s: float) -> None:
        """``key``'s copy was reserved or removed, or its order inputs changed."""
        if self._until_s is None:
            return
        if now_s > self._until_s:
            self.invalidate()  # the next query rebuilds anyway: stop tracking changes
            return
        self._dirty.add(key)

    def invalidate(self) -> None:
        """Every copy's order inputs changed: the next query recomputes every floor."""
        self._until_s = None
        self._heap, self._borrowed = [], []
        self._live.clear()
        self._dirty.clear()

    def ranked(self, now_s: float) -> Iterator[ResidentEntry]:
        """Evictable copies, most evictable first, lazily. Valid until the next call; copies
        may be removed while it runs (their keys are noted), none reserved."""
        if self._until_s is None or now_s > self._until_s:
            self._build(now_s)
        else:
            self._restore()
            self._refresh(now_s, self._until_s)
        self._query += 1
        return self._iterate(self._query, now_s)

    def check(self, now_s: float) -> None:
        """Every copy has one current floor (or is noted), and each floor bounds its key."""
        if self._until_s is None or now_s > self._until_s:
            return
        require(
            self._live.keys() - self._dirty <= self._entries.keys(),
            "victim index holds only resident copies",
            f"{sorted(k.ref for k in self._live.keys() - self._entries.keys())}",
        )
        require(
            self._entries.keys() <= self._live.keys() | self._dirty,
            "victim index covers every copy",
            f"{sorted(k.ref for k in self._entries.keys() - self._live.keys())}",
        )
        for floor, seq, key in self._heap + self._borrowed:
            if self._live.get(key) == seq and key not in self._dirty:
                true = self._order.key(self._entries[key], now_s)
                require(floor <= true, "victim floors bound their keys", f"{floor} > {true}")

    def _build(self, now_s: float) -> None:
        self.invalidate()
        until_s = self._until_s = now_s + self.horizon_s
        for key, entry in self._entries.items():
            self._heap.append(self._item(key, self._order.floor(entry, now_s, until_s)))
        heapq.heapify(self._heap)

    def _restore(self) -> None:
        for item in self._borrowed:
            if self._live.get(item[2]) == item[1]:
                heapq.heappush(self._heap, item)
        self._borrowed = []

    def _refresh(self, now_s: float, until_s: float) -> None:
        for key in self._dirty:
            entry = self._entries.get(key)
            if entry is None:
                self._live.pop(key, None)
            else:
                item = self._item(key, self._order.floor(entry, now_s, until_s))
                heapq.heappush(self._heap, item)
        self._dirty.clear()
        if len(self._heap) > _STALE_PER_LIVE * len(self._live) + _STALE_SLACK:
            self._heap = [item for item in self._heap if self._live.get(item[2]) == item[1]]
            heapq.heapify(self._heap)

    def _item(self, key: AdapterKey, floor: OrderKey) -> _Item:
        self._seq += 1
        self._live[key] = self._seq
        return (floor, self._seq, key)

    def _current(self, seq: int, key: AdapterKey) -> ResidentEntry | None:
        """The copy an item stands for, if the item is its current floor."""
        if self._live.get(key) != seq or key in self._dirty:
            return None
        return self._entries.get(key)

    def _iterate(self, query: int, now_s: float) -> Iterator[ResidentEntry]:
        refined: list[_Item] = []  # popped evictable copies by their true key at now_s
        while True:
            if query != self._query:
                raise RuntimeError("victim order iterated after a newer query")
            # Refine until no floor left is below the smallest true key: that copy is next.
            while self._heap and (not refined or self._heap[0][0] < refined[0][0]):
                item = heapq.heappop(self._heap)
                self._borrowed.append(item)
                entry = self._current(item[1], item[2])
                if entry is not None and entry.evictable:
                    heapq.heappush(refined, (self._order.key(entry, now_s), item[1], item[2]))
            if not refined:
                return
            _, seq, key = heapq.heappop(refined)
            entry = self._current(seq, key)
            if entry is not None and entry.evictable:
                yield entry


class CandidateSource(Protocol):
    """Where the policy's view of a copy comes from (``TierState``)."""

    policy: EvictionPolicy

    def candidate_of(
        self,
        key: AdapterKey,
        tier: Tier,
        size_bytes: int,
        loaded_at_s: float,
        *,
        at_s: float | None = None,
        bandwidth: float | None = None,
    ) -> Candidate:
        """The copy with rates as of ``at_s`` and the reload cost at ``bandwidth``."""
        ...


class PolicyOrder:
    """One tier's ``VictimOrder`` through the eviction policy.

    A floor is the policy's over a candidate with the rates an idle copy has left at
    ``until_s`` (they only decay) and the reload cost at a ceiling of the source tier's
    bandwidth estimate (costs only rise as bandwidth falls). The estimate moves with every
    measured fill, so the cache asks ``holds`` before each query (and ``reset``s when not)."""

    def __init__(self, source: CandidateSource, tier: Tier) -> None:
        self._source = source
        self._tier = tier
        self._ceiling = 0.0  # bytes per second every floor assumes; 0: none computed yet

    def holds(self, bandwidth: float) -> bool:
        """Whether floors computed at the ceiling hold (and are tight) at estimate ``bandwidth``."""
        return self._ceiling / _BANDWIDTH_BAND < bandwidth <= self._ceiling

    def reset(self, bandwidth: float) -> None:
        """A new ceiling above the estimate ``bandwidth``: the index must be invalidated."""
        self._ceiling = bandwidth * _BANDWIDTH_HEADROOM

    def key(self, entry: ResidentEntry, now_s: float) -> OrderKey:
        candidate = self._source.candidate_of(
            entry.key, self._tier, entry.size_bytes, entry.loaded_at_s, at_s=now_s
        )
        return self._source.policy.order_key(candidate, now_s)

    def floor(self, entry: ResidentEntry, now_s: float, until_s: float) -> OrderKey:
        candidate = self._source.candidate_of(
            entry.key,
            self._tier,
            entry.size_bytes,
            entry.loaded_at_s,
            at_s=until_s,
            bandwidth=self._ceiling,
        )
        return self._source.policy.order_key_floor(candidate, now_s, until_s)
