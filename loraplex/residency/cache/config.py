"""The adapter cache's configuration and its reload-cost model (what losing a copy costs).

Torch-free. ``ReloadCosts`` turns measured move times into the ``reload_cost_s`` the eviction
policy weighs: a tier's copy is valued by the move that refills *that* tier (from the next tier
down, the only way a fill proceeds), never by where the adapter's deeper copies happen to be at
the moment. Those deeper copies are a function of popularity (a hot adapter keeps its L1 copy),
so pricing an L0 copy by its current fallback would rank hot adapters cheapest to lose.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from loraplex.residency.ledger import CACHED_TIERS, TIER_BELOW, Tier, TierBudget
from loraplex.residency.pipeline import Footprint, Move
from loraplex.residency.warm import AutoWarmConfig

# Weight of a new measurement in the running per-tier bandwidth estimate (reload costs).
_BANDWIDTH_EWMA = 0.2


def _default_bandwidth() -> dict[Tier, float]:
    return {Tier.L1: 5e9, Tier.L2: 5e8, Tier.L3: 1e8}


@dataclass(frozen=True)
class CacheConfig:
    """Budgets and bounds of one worker's adapter cache."""

    budgets: Mapping[Tier, TierBudget]  # L0 (with num_slots), L1, L2
    max_concurrent_loads: int = 4  # loads in flight, all tenants
    tenant_max_concurrent_loads: int = 2  # loads in flight per tenant (cold-load quota)
    tenant_priority: Mapping[str, float] = field(default_factory=dict)  # 1.0 when absent
    # A tenant's tier share holds only against tenants of the same or lower priority: a load of
    # a lower-priority tenant never reclaims a higher-priority tenant's borrowed room first (it
    # takes room by the eviction policy alone) nor holds up that tenant's leases while it waits,
    # and a higher-priority tenant's load past its own share may still take a lower one's
    # copies, in the policy's order (``share_outranks``). False: every share holds against all.
    tier_share_by_priority: bool = False
    reload_window_s: float = 300.0  # a fill this soon after an eviction counts as a reload
    default_deadline_s: float | None = 30.0  # how long an acquirer waits; None: forever
    # The most a policy may defer a demand load (waiting for a cheaper copy rather than evict),
    # counted per request from when it asked: past it the load displaces its victims at once.
    max_request_deferral_s: float = 1.0
    bandwidth_bytes_per_s: Mapping[Tier, float] = field(default_factory=_default_bandwidth)
    # Fixed seconds every miss costs whatever its bytes: an L0 miss parks its request for at
    # least one engine step (~a decode step). It makes the keep-score count misses, not bytes.
    miss_stall_s: float = 0.02
    auto_warm: AutoWarmConfig | None = None  # automatic promotion/demotion; None: off
    # L0 slots automatic gpu promotion may pin, shared between tenants by L0's default share
    max_auto_gpu_slots: int = 0
    # Keys without any copy, load or pin whose history (request rates, counters) is kept so
    # frequency survives eviction; beyond it the least recently active are forgotten.
    max_idle_keys: int = 10_000
    # How long the victim order's lower bounds hold: past it, the next placement that needs
    # victims recomputes them for every copy of the tier (O(copies), once per horizon). Longer
    # horizons rebuild less often but with looser bounds, so each placement refines more copies.
    victim_order_horizon_s: float = 10.0

    def __post_init__(self) -> None:
        for tier in CACHED_TIERS:
            if tier not in self.budgets:
                raise ValueError(f"budgets is missing tier {tier.name}; expected L0, L1 and L2")
        if self.budgets[Tier.L0].num_slots is None:
            raise ValueError("budgets[L0].num_slots is None; expected the slot pool's slot count")
        for name in ("max_concurrent_loads", "tenant_max_concurrent_loads", "max_idle_keys"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")
        for tier in (Tier.L1, Tier.L2, Tier.L3):
            if self.bandwidth_bytes_per_s.get(tier, 0) <= 0:
                raise ValueError(f"bandwidth_bytes_per_s[{tier.name}] is invalid; expected > 0")
        if self.default_deadline_s is not None and self.default_deadline_s < 0:
            raise ValueError(
                f"default_deadline_s {self.default_deadline_s} is invalid; expected >= 0"
            )
        if not self.max_request_deferral_s >= 0:
            raise ValueError(
                f"max_request_deferral_s {self.max_request_deferral_s} is invalid; expected >= 0"
            )
        if self.miss_stall_s < 0:
            raise ValueError(f"miss_stall_s {self.miss_stall_s} is invalid; expected >= 0")
        if not self.victim_order_horizon_s > 0:
            raise ValueError(
                f"victim_order_horizon_s {self.victim_order_horizon_s} is invalid; expected > 0"
            )
        for tenant, weight in self.tenant_priority.items():
            # The victim order's bounds assume keep-scores that only fall while a copy idles.
            if not weight >= 0:
                raise ValueError(f"tenant_priority[{tenant!r}] {weight} is invalid; expected >= 0")


def share_outranks(config: CacheConfig, owner: str, requester: str) -> bool:
    """Whether ``owner``'s borrowed room is kept from ``requester``'s reclaim (``owner`` of a
    higher priority, under ``tier_share_by_priority``)."""
    if not config.tier_share_by_priority:
        return False
    priority = config.tenant_priority
    return priority.get(owner, 1.0) > priority.get(requester, 1.0)


class ReloadCosts:
    """Per-tier refill costs from a running bandwidth estimate (mutated under the cache lock)."""

    def __init__(self, config: CacheConfig) -> None:
        self._bandwidth = dict(config.bandwidth_bytes_per_s)
        self._stall_s = config.miss_stall_s

    def reload_cost_s(
        self,
        tier: Tier,
        footprint: Footprint | None,
        size_bytes: int,
        bandwidth: float | None = None,
    ) -> float:
        """Seconds a miss in ``tier`` costs: the fixed stall plus the bytes the refilling move
        reads from the next tier down over that tier's bandwidth (``size_bytes`` when the
        footprint is unknown, as for copies recovered at start). ``bandwidth`` replaces the
        current estimate (the victim order's bound prices copies at a ceiling)."""
        rate = self._bandwidth[TIER_BELOW[tier]] if bandwidth is None else bandwidth
        return self._stall_s + self.refill_bytes(tier, footprint, size_bytes) / rate

    @staticmethod
    def refill_bytes(tier: Tier, footprint: Footprint | None, size_bytes: int) -> int:
        """The bytes the move refilling ``tier`` reads from the next tier down."""
        return size_bytes if footprint is None else footprint.bytes_in(TIER_BELOW[tier])

    def bandwidth(self, source: Tier) -> float:
        """The current estimate of ``source``'s read bandwidth (bytes per second)."""
        return self._bandwidth[source]

    def measured(self, move: Move, moved_bytes: int, seconds: float) -> None:
        """Feeds one completed move into the bandwidth estimate of its source tier."""
        if seconds > 0 and moved_bytes > 0:
            old = self._bandwidth[move.source]
            new = moved_bytes / seconds
            self._bandwidth[move.source] = (1 - _BANDWIDTH_EWMA) * old + _BANDWIDTH_EWMA * new
