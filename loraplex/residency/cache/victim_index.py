"""One tier's victims in the policy's exact order, without ranking every copy per placement.

Torch-free; runs under the cache's lock. Sorting every evictable copy on each placement costs
O(copies log copies); this index keeps a heap of lower bounds ("floors") of each copy's order key
that hold until a horizon, and a query pops copies by floor into a small heap keyed by their
true key at ``now``, yielding its minimum once no floor left in the index is below it (bound and
refine). The order is exactly the policy's sort of every evictable copy, while a placement
computes true keys only for copies whose floor falls below the victims it takes.

Copies whose relative order stays fixed (``VictimOrder.group``: in practice copies nobody
requested lately, of one priority, shape and youth, ranked by last access) are not bounded one
by one: each group keeps its members in a heap by rank and holds one floor in the main heap, a
floor of its lowest-ranked member. A query that reaches that floor refines the group's head
only, and the next member once the head is taken. Otherwise floors of idle copies, all close to
the horizon's score (or of young copies, which are old by the horizon), would fall below the
victims' keys and a placement would refine nearly every copy (copies recovered at start, or
idle past the rate windows). A member whose group lapses (youth ends) is re-indexed.

A copy is re-indexed at the next query after ``note`` says its order inputs changed (a request,
a footprint, the copy reserved or removed); readiness, leases and pins are not in the key, so
such copies stay indexed and are skipped when met. Everything is recomputed when the horizon
passed or after ``invalidate`` (inputs of every copy changed), and only when a query needs the
order: a tier with free room never pays for it.

A tier of at most ``SORT_AT_MOST`` copies (an L0 of a few slots) is sorted instead, by the same
true keys: for so few copies the floors, groups and refinement cost more than the keys (on an
L1 -> L0 load into a full 2-slot L0 they were most of the victim pick). Every policy's order key
ends in the adapter key, so the order is total and the same either way; the index then stays
invalidated, and notes cost nothing, until the tier grows past the bound.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator, Mapping

from loraplex.artifacts.identity import AdapterKey
from loraplex.residency.cache.victim_order import VictimOrder
from loraplex.residency.ledger import ResidentEntry
from loraplex.residency.ledger import require_invariant as require
from loraplex.residency.policy import OrderKey

# (floor, sequence number, adapter key, group): a copy's own floor (group None) or a group's
# floor (computed for that member). Sequence numbers are unique, so items never tie.
_Item = tuple[OrderKey, int, AdapterKey, Hashable | None]
# A group member: (rank, sequence number, adapter key).
_Member = tuple[OrderKey, int, AdapterKey]
# Stale heap items (superseded floors, members) tolerated per live one before compaction.
_STALE_PER_LIVE = 2
_STALE_SLACK = 64
# A tier holding at most this many copies is ranked by sorting them at each query.
SORT_AT_MOST = 8


class VictimIndex:
    """Floors and groups of one tier's copies; ``ranked`` yields its evictable copies in order."""

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
        self._live: dict[AdapterKey, int] = {}  # key -> sequence number of its current item
        self._dirty: set[AdapterKey] = set()  # keys re-indexed at the next query
        self._borrowed: list[_Item] = []  # popped by the last query: back in the heap next time
        self._groups: dict[Hashable, list[_Member]] = {}  # group -> its members by rank
        self._group_floor: dict[Hashable, tuple[int, OrderKey]] = {}  # seq and rank it bounds
        self._lent: list[tuple[Hashable, _Member]] = []  # members popped by the last query
        self._members = 0  # items in all group heaps, stale ones included
        self._lapses: list[tuple[float, int, AdapterKey]] = []  # when members' groups lapse
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
        """Every copy's order inputs changed: the next query re-indexes every copy."""
        self._until_s = None
        self._heap, self._borrowed, self._lent, self._lapses = [], [], [], []
        self._groups.clear()
        self._group_floor.clear()
        self._members = 0
        self._live.clear()
        self._dirty.clear()

    def ranked(self, now_s: float) -> Iterator[ResidentEntry]:
        """Evictable copies, most evictable first, lazily. Valid until the next call; copies
        may be removed while it runs (their keys are noted), none reserved."""
        if len(self._entries) <= SORT_AT_MOST:
            if self._until_s is not None:
                self.invalidate()  # dormant while the tier stays this small: notes are free
            self._query += 1
            return self._sorted(self._query, now_s)
        if self._until_s is None or now_s > self._until_s:
            self._build(now_s)
        else:
            self._restore()
            self._lapse(now_s)
            self._refresh(now_s, self._until_s)
        self._query += 1
        return self._iterate(self._query, now_s)

    def check(self, now_s: float) -> None:
        """Every copy has one current item (or is noted); floors bound their keys; each group's
        ranks order its members' keys (members whose group lapsed are noted first)."""
        if self._until_s is None or now_s > self._until_s:
            return
        self._lapse(now_s)
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
        floors: dict[Hashable, OrderKey] = {}
        for floor, seq, key, group in self._heap + self._borrowed:
            if group is not None:
                if self._floor_seq(group) == seq:
                    floors[group] = floor
            elif self._current(seq, key) is not None:
                true = self._order.key(self._entries[key], now_s)
                require(floor <= true, "victim floors bound their keys", f"{floor} > {true}")
        members: dict[Hashable, list[_Member]] = {}
        for group, member in self._lent + [(g, m) for g, ms in self._groups.items() for m in ms]:
            if self._current(member[1], member[2]) is not None:
                members.setdefault(group, []).append(member)
        for group, ranked in members.items():
            require(group in floors, "every victim group has a floor", f"{group}")
            keys = [self._order.key(self._entries[k], now_s) for _, _, k in sorted(ranked)]
            require(keys == sorted(keys), "group ranks order their keys", f"{group}")
            require(floors[group] <= keys[0], "group floors bound their keys", f"{group}")

    def _build(self, now_s: float) -> None:
        self.invalidate()
        self._until_s = now_s + self.horizon_s
        for key, entry in self._entries.items():
            self._index(key, entry, now_s, self._until_s)

    def _restore(self) -> None:
        for item in self._borrowed:
            if self._is_current(item):
                heapq.heappush(self._heap, item)
        for group, member in self._lent:
            if self._live.get(member[2]) == member[1]:
                heapq.heappush(self._groups[group], member)
            else:
                self._members -= 1
        self._borrowed, self._lent = [], []

    def _refresh(self, now_s: float, until_s: float) -> None:
        for key in self._dirty:
            entry = self._entries.get(key)
            if entry is None:
                self._live.pop(key, None)
            else:
                self._index(key, entry, now_s, until_s)
        self._dirty.clear()
        if len(self._heap) + self._members > _STALE_PER_LIVE * len(self._live) + _STALE_SLACK:
            self._compact()

    def _compact(self) -> None:
        self._heap = [item for item in self._heap if self._is_current(item)]
        heapq.heapify(self._heap)
        for heap in self._groups.values():
            heap[:] = [m for m in heap if self._live.get(m[2]) == m[1]]
            heapq.heapify(heap)
        self._members = sum(len(heap) for heap in self._groups.values())

    def _index(self, key: AdapterKey, entry: ResidentEntry, now_s: float, until_s: float) -> None:
        """A new current item for ``key``: its own floor, or a place in its group."""
        self._seq += 1
        self._live[key] = seq = self._seq
        grouped = self._order.group(entry, now_s)
        if grouped is None:
            floor = self._order.floor(entry, now_s, until_s)
            heapq.heappush(self._heap, (floor, seq, key, None))
            return
        group, rank = grouped.group, grouped.rank
        heapq.heappush(self._groups.setdefault(group, []), (rank, seq, key))
        self._members += 1
        if grouped.until_s < until_s:
            heapq.heappush(self._lapses, (grouped.until_s, seq, key))
        bound = self._group_floor.get(group)
        if bound is None or rank < bound[1]:
            # Removals keep a group's floor valid; only a member ranked below it needs a new one.
            self._seq += 1
            self._group_floor[group] = (self._seq, rank)
            floor = self._order.floor(entry, now_s, until_s)
            heapq.heappush(self._heap, (floor, self._seq, key, group))

    def _lapse(self, now_s: float) -> None:
        """Notes the members whose group no longer holds at ``now_s`` (re-indexed next)."""
        while self._lapses and self._lapses[0][0] <= now_s:
            _, seq, key = heapq.heappop(self._lapses)
            if self._live.get(key) == seq:
                self._dirty.add(key)

    def _is_current(self, item: _Item) -> bool:
        """Whether a main-heap item is its copy's current floor or its group's."""
        _, seq, key, group = item
        if group is None:
            return self._live.get(key) == seq
        return self._floor_seq(group) == seq

    def _floor_seq(self, group: Hashable) -> int | None:
        """The sequence number of ``group``'s current floor item."""
        bound = self._group_floor.get(group)
        return None if bound is None else bound[0]

    def _current(self, seq: int, key: AdapterKey) -> ResidentEntry | None:
        """The copy an item stands for, if the item is current."""
        if self._live.get(key) != seq or key in self._dirty:
            return None
        return self._entries.get(key)

    def _iterate(self, query: int, now_s: float) -> Iterator[ResidentEntry]:
        refined: list[_Item] = []  # popped evictable copies by their true key at now_s
        opened: set[Hashable] = set()  # groups whose head is in ``refined`` or taken
        while True:
            if query != self._query:
                raise RuntimeError("victim order iterated after a newer query")
            # Refine until no floor left is below the smallest true key: that copy is next.
            while self._heap and (not refined or self._heap[0][0] < refined[0][0]):
                item = heapq.heappop(self._heap)
                self._borrowed.append(item)
                _, seq, key, group = item
                if group is None:
                    entry = self._current(seq, key)
                    if entry is not None and entry.evictable:
                        heapq.heappush(refined, (self._order.key(entry, now_s), seq, key, None))
                elif group not in opened and self._group_floor[group][0] == seq:
                    opened.add(group)
                    self._refine_head(group, now_s, refined)
            if not refined:
                return
            _, seq, key, group = heapq.heappop(refined)
            entry = self._current(seq, key)
            if entry is not None and entry.evictable:
                yield entry
            if group is not None:  # the group's next member may come next
                self._refine_head(group, now_s, refined)

    def _sorted(self, query: int, now_s: float) -> Iterator[ResidentEntry]:
        """A small tier's evictable copies sorted by their true keys at ``now_s``."""
        if query != self._query:
            raise RuntimeError("victim order iterated after a newer query")
        keyed = [(self._order.key(e, now_s), e) for e in self._entries.values() if e.evictable]
        keyed.sort(key=lambda pair: pair[0])
        for _, entry in keyed:
            if query != self._query:
                raise RuntimeError("victim order iterated after a newer query")
            if entry.evictable and self._entries.get(entry.key) is entry:
                yield entry

    def _refine_head(self, group: Hashable, now_s: float, refined: list[_Item]) -> None:
        """Moves ``group``'s lowest-ranked evictable member into ``refined`` (true key)."""
        heap = self._groups[group]
        while heap:
            member = heapq.heappop(heap)
            _, seq, key = member
            if self._live.get(key) != seq:
                self._members -= 1  # superseded: gone for good
                continue
            self._lent.append((group, member))
            entry = self._current(seq, key)
            if entry is not None and entry.evictable:
                heapq.heappush(refined, (self._order.key(entry, now_s), seq, key, group))
                return
