"""Tier levels, byte budgets and the per-tier ledger: what is resident where, and who pays.

Torch-free bookkeeping only; the tier order (which tier fills which) lives in the cache and
the bytes themselves in the tier backends. A ledger entry exists from the moment room is taken
for an adapter (``ready`` False while its bytes are being installed) until it is removed, so the
ledger's totals always cover every byte a tier holds or is about to hold.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import IntEnum

from loraplex.artifacts.identity import AdapterKey
from loraplex.errors import AdapterTooLargeError, CacheIntegrityError, TenantCapTooSmallError
from loraplex.residency.reclaim import RoomNeed, pick_victims


class Tier(IntEnum):
    """Cache levels, fastest first."""

    L0 = 0  # GPU slot (a slot pool entry the kernels index)
    L1 = 1  # CPU memory
    L2 = 2  # local disk, verified files named by digest
    L3 = 3  # artifact store (remote or local directory); unbounded


CACHED_TIERS = (Tier.L0, Tier.L1, Tier.L2)
# The tier each cached tier refills from (the next one down): a lookup, where ``Tier(t + 1)``
# is an enum call per use (a dozen per placement in the victim order's reload costs).
TIER_BELOW = {Tier.L0: Tier.L1, Tier.L1: Tier.L2, Tier.L2: Tier.L3}


# The tenant quota that caps each cached tier (``registry.TenantQuotas``), named in refusals.
TENANT_CAP_FIELDS = {Tier.L0: "max_gpu_bytes", Tier.L1: "max_cpu_bytes", Tier.L2: "max_disk_bytes"}


@dataclass(frozen=True)
class TierBudget:
    """Capacity of one cached tier."""

    capacity_bytes: int  # bytes the tier may hold
    num_slots: int | None = None  # L0 only: the slot pool's slot count
    tenant_max_bytes: Mapping[str, int] = field(default_factory=dict)  # per-tenant hard cap
    # the fraction of capacity_bytes each tenant keeps against the others (1.0: no share): a
    # guarantee, not a cap; free room beyond it is borrowed, and reclaimed first
    # (``residency/reclaim.py``)
    default_tenant_share: float = 1.0

    def __post_init__(self) -> None:
        if self.capacity_bytes < 0:
            raise ValueError(f"capacity_bytes {self.capacity_bytes} is invalid; expected >= 0")
        check_tier_share(self.default_tenant_share, "default_tenant_share")
        if self.num_slots is not None and self.num_slots < 0:
            raise ValueError(f"num_slots {self.num_slots} is invalid; expected >= 0")
        for tenant, cap in self.tenant_max_bytes.items():
            if cap < 0:
                raise ValueError(f"tenant_max_bytes[{tenant!r}] {cap} is invalid; expected >= 0")

    @property
    def default_tenant_share_bytes(self) -> int | None:
        """The bytes of the tier each tenant keeps against the others; None: no share."""
        if self.default_tenant_share >= 1:
            return None
        return int(self.capacity_bytes * self.default_tenant_share)


@dataclass
class ResidentEntry:
    """One adapter's presence in one tier (mutable; owned by its ledger, under the cache lock)."""

    key: AdapterKey  # the adapter revision
    tier: Tier  # where
    size_bytes: int  # bytes charged to the tier and to ``charged``
    loaded_at_s: float  # when room was taken
    last_access_s: float  # last hit or load in this tier
    slot: int | None  # L0 slot index; None elsewhere
    ready: bool = False  # False while the bytes are being installed
    refcount: int = 0  # leases and in-flight loads reading this copy
    pinned: bool = False  # never evicted while set
    # the tenant whose share and cap the copy counts against: the one whose request loaded it
    # (the owner, ``key.tenant``, unless another tenant called its public adapter), moved to
    # the owner on the owner's hit (``TierLedger.recharge``); "" in the constructor: the owner
    charged: str = ""

    def __post_init__(self) -> None:
        if not self.charged:
            self.charged = self.key.tenant

    @property
    def evictable(self) -> bool:
        return self.ready and self.refcount == 0 and not self.pinned


class TierLedger:
    """Accounting of one tier: entries, bytes (total and per tenant) and, for L0, slots."""

    def __init__(self, tier: Tier, budget: TierBudget) -> None:
        self.tier = tier
        self.budget = budget
        self.entries: dict[AdapterKey, ResidentEntry] = {}
        self.used_bytes = 0
        self.tenant_bytes: dict[str, int] = {}
        self._free_slots = list(range(budget.num_slots or 0))
        # Bytes a tenant held above a cap lowered while its copies were in use or pinned: they
        # stay until they leave; the allowance shrinks as they do, admissions obey the cap.
        self._over_cap: dict[str, int] = {}

    def set_tenant_caps(self, caps: Mapping[str, int]) -> None:
        """Replaces the per-tenant byte caps of this tier (live tenant settings)."""
        self.budget = replace(self.budget, tenant_max_bytes=dict(caps))
        self._over_cap = {
            tenant: used
            for tenant, used in self.tenant_bytes.items()
            if not self.within_cap(tenant)
        }

    def tenant_cap(self, tenant: str) -> int | None:
        """``tenant``'s own byte cap here (hard: never exceeded by a load); None: none."""
        return self.budget.tenant_max_bytes.get(tenant)

    def tenant_share(self, tenant: str) -> int | None:
        """The bytes ``tenant`` keeps against other tenants: the default share, no more than
        its own cap; None: no share (the tier's default share is 1.0)."""
        share = self.budget.default_tenant_share_bytes
        cap = self.tenant_cap(tenant)
        if share is None or cap is None:
            return share
        return min(share, cap)

    def claim_limit(self, tenant: str, size_bytes: int) -> int | None:
        """The bytes ``tenant`` may reach, with a copy of ``size_bytes``, by evicting other
        tenants' copies: its cap, and its share or (NOTE: the share refuses nothing the tier
        could hold) that one copy if larger; None: no limit. Free room it may take up to its
        cap."""
        share = self.tenant_share(tenant)
        claim = None if share is None else max(share, size_bytes)
        limits = [limit for limit in (self.tenant_cap(tenant), claim) if limit is not None]
        return min(limits) if limits else None

    def within_cap(self, tenant: str) -> bool:
        """Whether ``tenant``'s bytes here respect its own cap (a share is no cap)."""
        cap = self.tenant_cap(tenant)
        return cap is None or self.tenant_bytes.get(tenant, 0) <= cap

    def get(self, key: AdapterKey) -> ResidentEntry | None:
        return self.entries.get(key)

    def check_admissible(self, tenant: str, size_bytes: int) -> None:
        """Raises AdapterTooLargeError when no amount of eviction could ever make room."""
        cap = self.budget.tenant_max_bytes.get(tenant)
        fits_tier = size_bytes <= self.budget.capacity_bytes and self.budget.num_slots != 0
        if fits_tier and cap is not None and size_bytes > cap:
            # NOTE: this said the adapter was too large ("exceed the capacity"), a 422
            # ``adapter_too_large`` blaming the tenant's adapter for its operator's cap
            field = TENANT_CAP_FIELDS[self.tier]
            raise TenantCapTooSmallError(
                f"tier {self.tier.name}: the tenant cap {field} {cap} of tenant {tenant!r} is "
                f"below the {size_bytes} bytes one copy of this adapter takes there (the tier "
                f"holds {self.budget.capacity_bytes}): the tenant's cap refuses it, not the "
                "adapter; an operator raises or lifts the cap (PUT /admin/tenants/"
                f"{tenant})"
            )
        if not fits_tier:
            raise AdapterTooLargeError(
                f"tier {self.tier.name}: {size_bytes} bytes for tenant {tenant!r} exceed the "
                f"capacity ({self.budget.capacity_bytes} bytes, tenant cap {cap})"
            )

    def plan_room(
        self,
        tenant: str,
        size_bytes: int,
        ranked: Callable[[], Iterable[ResidentEntry]],
        outranks: Callable[[str, str], bool] | None = None,
    ) -> list[ResidentEntry] | None:
        """Victims (a prefix-greedy pick from ``ranked()``, most evictable first, by the
        work-conserving share's rule in ``residency/reclaim.py``) whose removal makes room for
        ``size_bytes`` of ``tenant``: [] when it fits in free room, up to its own cap whatever
        its share (``ranked`` is then never called, so a load into free room costs nothing per
        cached copy); None when the evictable entries it may take cannot suffice. ``ranked()``
        is consumed lazily, only as far as the pick goes. ``outranks(a, b)`` true: ``a``'s
        share does not give way to ``b`` and ``b``'s share does not hold against ``a``
        (``CacheConfig.tier_share_by_priority``: ``a`` of a higher priority): a load of ``b`` does
        not reclaim ``a``'s borrowed room first, and a load of ``a`` beyond its own share may
        still take ``b``'s copies, in the policy's order."""
        if self.fits_free(tenant, size_bytes):
            return []
        held = self.tenant_bytes.get(tenant, 0)
        cap, claim = self.tenant_cap(tenant), self.claim_limit(tenant, size_bytes)
        need = RoomNeed(
            tenant,
            size_bytes,
            free_bytes=self.budget.capacity_bytes - self.used_bytes,
            free_slots=len(self._free_slots) if self.budget.num_slots is not None else None,
            cap_free=None if cap is None else cap - held,
            claim_free=None if claim is None else claim - held,
        )
        excess = self._excess(besides=tenant)
        if outranks is not None:
            excess = {t: b for t, b in excess.items() if not outranks(t, tenant)}
            need.outranked = lambda owner: outranks(tenant, owner)
        need.excess = excess
        return pick_victims(need, ranked)

    def fits_free(self, tenant: str, size_bytes: int) -> bool:
        """Whether ``size_bytes`` of ``tenant`` fit in free room now, within its own cap and
        with a free slot where the tier has slots (``RoomNeed.fits`` before any victim): then
        no copy is evicted and the load is admissible (``check_admissible`` cannot raise)."""
        cap = self.tenant_cap(tenant)
        return (
            self.budget.capacity_bytes - self.used_bytes >= size_bytes
            and (cap is None or cap - self.tenant_bytes.get(tenant, 0) >= size_bytes)
            and (self.budget.num_slots is None or len(self._free_slots) > 0)
        )

    def _excess(self, besides: str) -> dict[str, int]:
        """Bytes each tenant but ``besides`` holds above its share (O(tenants here))."""
        excess: dict[str, int] = {}
        if self.budget.default_tenant_share_bytes is None:
            return excess
        for tenant, used in self.tenant_bytes.items():
            share = self.tenant_share(tenant)
            if tenant != besides and share is not None and used > share:
                excess[tenant] = used - share
        return excess

    def fits_beside_pins(self, tenant: str, size_bytes: int) -> bool:
        """Whether ``size_bytes`` of ``tenant`` would fit if every unpinned entry were gone:
        pins reserve their capacity, so a load that fails this can only wait for an unpin (or,
        for a tenant whose pins hold its share, for free room)."""
        pinned = [e for e in self.entries.values() if e.pinned]
        free = self.budget.capacity_bytes - sum(e.size_bytes for e in pinned)
        cap = self.claim_limit(tenant, size_bytes)
        own = sum(e.size_bytes for e in pinned if e.charged == tenant)
        tenant_free = None if cap is None else cap - own
        slots = None if self.budget.num_slots is None else self.budget.num_slots - len(pinned)
        return _fits(free, tenant_free, slots, size_bytes)

    def reserve(
        self, key: AdapterKey, size_bytes: int, now_s: float, charged: str | None = None
    ) -> ResidentEntry:
        """Takes room for ``key`` (the caller made room first), charged to ``charged`` (None:
        the owner, ``key.tenant``); the entry starts not ready."""
        if key in self.entries:
            raise CacheIntegrityError(
                "one entry per key and tier", f"{key.ref} already in {self.tier.name}"
            )
        slot = heapq.heappop(self._free_slots) if self.budget.num_slots is not None else None
        tenant = charged or key.tenant
        entry = ResidentEntry(key, self.tier, size_bytes, now_s, now_s, slot, charged=tenant)
        self.entries[key] = entry
        self.used_bytes += size_bytes
        self.tenant_bytes[tenant] = self.tenant_bytes.get(tenant, 0) + size_bytes
        return entry

    def remove(self, key: AdapterKey) -> ResidentEntry:
        entry = self.entries.pop(key)
        self.used_bytes -= entry.size_bytes
        self._uncharge(entry.charged, entry.size_bytes)
        if entry.slot is not None:
            heapq.heappush(self._free_slots, entry.slot)
        return entry

    def recharge(self, key: AdapterKey, tenant: str) -> bool:
        """Moves ``key``'s copy's charge (its bytes in ``tenant_bytes``) to ``tenant``, in O(1);
        False, and nothing moved, when ``tenant``'s own cap here could not take it (a cap is
        hard: the copy stays charged to the tenant that loaded it)."""
        entry = self.entries[key]
        if entry.charged == tenant:
            return True
        cap = self.tenant_cap(tenant)
        if cap is not None and self.tenant_bytes.get(tenant, 0) + entry.size_bytes > cap:
            return False
        self._uncharge(entry.charged, entry.size_bytes)
        entry.charged = tenant
        self.tenant_bytes[tenant] = self.tenant_bytes.get(tenant, 0) + entry.size_bytes
        return True

    def _uncharge(self, tenant: str, size_bytes: int) -> None:
        left = self.tenant_bytes[tenant] - size_bytes
        if left:
            self.tenant_bytes[tenant] = left
        else:
            del self.tenant_bytes[tenant]
        if tenant in self._over_cap:
            if self.within_cap(tenant):
                del self._over_cap[tenant]
            else:
                self._over_cap[tenant] = left

    def check(self) -> None:
        """Raises CacheIntegrityError naming the first broken invariant."""
        name = self.tier.name
        total = sum(e.size_bytes for e in self.entries.values())
        require_invariant(
            total == self.used_bytes,
            "accounting equals resident entries",
            f"{name}: used_bytes {self.used_bytes} != sum of entries {total}",
        )
        require_invariant(
            self.used_bytes <= self.budget.capacity_bytes,
            "capacity respected",
            f"{name}: {self.used_bytes} > {self.budget.capacity_bytes} bytes",
        )
        per_tenant: dict[str, int] = {}
        for entry in self.entries.values():
            per_tenant[entry.charged] = per_tenant.get(entry.charged, 0) + entry.size_bytes
            require_invariant(
                entry.refcount >= 0,
                "refcounts non-negative",
                f"{name}: {entry.key.ref} refcount {entry.refcount}",
            )
        require_invariant(
            per_tenant == self.tenant_bytes,
            "tenant accounting equals resident entries",
            f"{name}: {self.tenant_bytes} != {per_tenant}",
        )
        for tenant, used in per_tenant.items():
            require_invariant(
                self.within_cap(tenant) or used <= self._over_cap.get(tenant, 0),
                "tenant budgets respected",
                f"{name}: tenant {tenant!r} holds {used} > {self.tenant_cap(tenant)} bytes",
            )
        self._check_slots()

    def _check_slots(self) -> None:
        if self.budget.num_slots is None:
            return
        owned = [e.slot for e in self.entries.values()]
        require_invariant(
            None not in owned, "every L0 entry owns a slot", f"{self.tier.name}: {owned}"
        )
        owned_set = {s for s in owned if s is not None}
        require_invariant(
            len(owned_set) == len(owned),
            "no slot owned twice",
            f"slots {sorted(owned_set)} from {len(owned)} entries",
        )
        require_invariant(
            not owned_set & set(self._free_slots),
            "no slot both free and owned",
            f"owned {sorted(owned_set)}, free {sorted(self._free_slots)}",
        )
        everything = owned_set | set(self._free_slots)
        require_invariant(
            everything == set(range(self.budget.num_slots))
            and len(self._free_slots) + len(owned) == self.budget.num_slots,
            "slots conserved",
            f"owned {sorted(owned_set)}, free {sorted(self._free_slots)}",
        )


def _fits(free: int, tenant_free: int | None, slots: int | None, size: int) -> bool:
    return (
        free >= size
        and (tenant_free is None or tenant_free >= size)
        and (slots is None or slots > 0)
    )


def check_tier_share(share: float, name: str = "default_tenant_tier_share") -> None:
    """Raises ValueError naming ``name`` unless ``share`` is a fraction in (0, 1]."""
    if not 0 < share <= 1:
        raise ValueError(f"{name} {share} is invalid; expected a fraction in (0, 1]")


def require_invariant(ok: bool, invariant: str, detail: str) -> None:
    """Raises CacheIntegrityError naming ``invariant`` when ``ok`` is False."""
    if not ok:
        raise CacheIntegrityError(invariant, detail)
