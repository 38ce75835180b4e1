"""Which copies make room for one load: the work-conserving tenant share, as a victim pick.

Torch-free; read by ``TierLedger.plan_room`` under the cache's lock. A tier's default tenant
share (``default_tenant_tier_share``) is a guarantee, not a cap (as CPU shares and cgroup weights
are): a tenant may borrow free room beyond its share, and when a load needs room the borrowed
copies go first. So no tenant's long tail can flush another's adapters, and one busy tenant
still fills every slot no one else wants. The whole rule, applied one victim at a time:

    the requester would exceed its own byte cap, or hold more than its share
    (or its one copy, if larger) with the new copy        -> evict its own copies only
    another tenant holds more than its share               -> the most over-share tenant's copy
                                                              (most evictable first, by the policy)
    otherwise                                              -> the most evictable copy of anyone

An explicit per-tenant cap (``max_gpu_bytes`` ...) stays hard; the ledger refuses free room
above it before this pick runs.

Under ``tier_share_by_priority`` (``CacheConfig``) a share holds only against tenants of the same or
lower priority: a higher-priority tenant's borrowed room is not "over its share" to a lower one's
load (that load takes the most evictable copy by the policy, as with no share), and a
higher-priority requester past its share may take, besides its own, the copies of tenants it
outranks (its cap stays hard). hot-burst on ``bench serve``: the batch tenant's sweep took back
half of the GPU slots from the high-priority tenant's 8 hot adapters, whatever the policy.

"Own", "the requester" and every tenant's holding here mean the tenant a copy is charged to
(``ResidentEntry.charged``): the tenant whose request loaded it, which for a call of another
tenant's public adapter is the caller, not the owner; the owner's own hit moves the charge to
the owner. NOTE: charged to the owner, a caller's hot copy of a public adapter sat in the
owner's share and the owner's loads evicted the owner's own copies (attack25, part A).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from loraplex.artifacts.identity import AdapterKey


class Copy(Protocol):
    """What the pick reads of a ledger entry (``ResidentEntry``)."""

    key: AdapterKey  # the revision
    size_bytes: int  # the room it frees
    charged: str  # whose share and cap it counts against (the tenant whose request loaded it)

    @property
    def evictable(self) -> bool: ...


C = TypeVar("C", bound=Copy)


@dataclass
class RoomNeed:
    """One load's need for room in one tier (mutated as victims are picked)."""

    tenant: str  # whose load: the tenant charged for it (the requester, not the key's owner)
    size_bytes: int  # the bytes it needs
    free_bytes: int  # the tier's free bytes
    free_slots: int | None  # L0: free slots; None in tiers without slots
    cap_free: int | None  # bytes below the tenant's own cap; None: no cap of its own
    claim_free: int | None  # bytes it may still take from other tenants; None: no limit
    # bytes each other tenant holds above its share (only tenants over it)
    excess: dict[str, int] = field(default_factory=dict)
    # owners whose copies the requester may take beyond its own share (lower priorities under
    # ``tier_share_by_priority``); None: none
    outranked: Callable[[str], bool] | None = None

    def fits(self) -> bool:
        size = self.size_bytes
        return (
            self.free_bytes >= size
            and (self.cap_free is None or self.cap_free >= size)
            and (self.free_slots is None or self.free_slots > 0)
        )

    def own_only(self) -> bool:
        """Whether the next victim must be the tenant's own copy (or, past its share but not
        its cap, an ``outranked`` owner's)."""
        size = self.size_bytes
        return (self.cap_free is not None and self.cap_free < size) or (
            self.claim_free is not None and self.claim_free < size
        )

    def may_take(self) -> Callable[[str], bool]:
        """Whose copies the next victim may be while ``own_only``."""
        outranked, tenant = self.outranked, self.tenant
        capped = self.cap_free is not None and self.cap_free < self.size_bytes
        if outranked is None or capped:
            return lambda owner: owner == tenant
        return lambda owner: owner == tenant or outranked(owner)

    def take(self, victim: Copy) -> None:
        self.free_bytes += victim.size_bytes
        if self.free_slots is not None:
            self.free_slots += 1
        owner = victim.charged
        if owner == self.tenant:
            if self.cap_free is not None:
                self.cap_free += victim.size_bytes
            if self.claim_free is not None:
                self.claim_free += victim.size_bytes
        elif owner in self.excess:
            left = self.excess[owner] - victim.size_bytes
            if left > 0:
                self.excess[owner] = left
            else:
                del self.excess[owner]


def pick_victims(need: RoomNeed, ranked: Callable[[], Iterable[C]]) -> list[C] | None:
    """Victims, a prefix-greedy pick from ``ranked()`` (most evictable first, consumed lazily)
    by the rule in this module's docstring, until ``need`` fits; None when they cannot suffice."""
    victims: list[C] = []
    pool = (e for e in ranked() if e.evictable)
    passed: list[C] = []  # entries passed over, in ranked order
    while not need.fits():
        if need.own_only():
            pick = _next_pick(passed, pool, need.may_take())
        else:
            pick = _reclaim(need, passed, pool)
        if pick is None:
            return None
        victims.append(pick)
        need.take(pick)
    return victims


def _reclaim(need: RoomNeed, passed: list[C], pool: Iterator[C]) -> C | None:
    """The most over-share tenant's most evictable copy; else anyone's most evictable copy."""
    while need.excess:
        most = max(need.excess, key=lambda t: (need.excess[t], t))
        pick = _next_pick(passed, pool, most.__eq__)
        if pick is not None:
            return pick
        del need.excess[most]  # nothing of it is evictable now
    return _next_pick(passed, pool, None)


def _next_pick(
    passed: list[C], pool: Iterator[C], owners: Callable[[str], bool] | None
) -> C | None:
    """The most evictable remaining entry (whose tenant ``owners`` accepts, unless None):
    ``passed`` entries rank before the rest of ``pool``; entries of other tenants met on the
    way join ``passed``."""
    for i, entry in enumerate(passed):
        if owners is None or owners(entry.charged):
            return passed.pop(i)
    for entry in pool:
        if owners is None or owners(entry.charged):
            return entry
        passed.append(entry)
    return None
