"""``FleetState``: what the admin fleet page and ``loraplex fleet status`` show of the replicas.

One ``loraplex serve`` is a fleet of one replica (``replica_id`` "local", no routing decisions);
``loraplex fleet`` fills it from every engine replica's latest report and the ingress's router.
``GET /admin/fleet`` returns ``to_json()``; ``/admin/dashboard`` polls it. Counters are
cumulative since each replica started (the page differences them into rates).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from loraplex.residency.cache.view import CacheSummary
from loraplex.residency.ledger import Tier

LOCAL_REPLICA_ID = "local"
CACHED_TIER_NAMES = ("l0", "l1", "l2")


@dataclass(frozen=True)
class TierOccupancy:
    """One cached tier of one replica."""

    count: int  # copies (ready or loading)
    used_bytes: int  # bytes held or reserved
    capacity_bytes: int  # the tier's budget
    # what a tenant without a byte cap of its own may hold here; None: the whole tier
    tenant_default_max_bytes: int | None = None

    def to_json(self) -> dict[str, int | None]:
        return {
            "count": self.count,
            "used_bytes": self.used_bytes,
            "capacity_bytes": self.capacity_bytes,
            "tenant_default_max_bytes": self.tenant_default_max_bytes,
        }


@dataclass(frozen=True)
class ReplicaLoadView:
    """A replica's load when it last reported."""

    num_queued: int  # requests waiting (for a seat or for their adapter)
    num_running: int  # requests holding KV blocks
    num_active_tokens: int  # prompt + generated tokens of running and queued requests
    kv_usage: float  # fraction 0-1 of KV blocks in use
    evictions_per_min: float  # evictions from any tier over the last minute

    def to_json(self) -> dict[str, float | int]:
        return {
            "num_queued": self.num_queued,
            "num_running": self.num_running,
            "num_active_tokens": self.num_active_tokens,
            "kv_usage": self.kv_usage,
            "evictions_per_min": self.evictions_per_min,
        }


@dataclass(frozen=True)
class ReplicaState:
    """One engine replica as the ingress last heard of it."""

    replica_id: str
    healthy: bool  # took requests at its last report and reported recently
    report_age_s: float | None  # seconds since its last report; None: never reported
    tiers: Mapping[str, TierOccupancy]  # "l0" | "l1" | "l2" -> occupancy
    hits: Mapping[str, int]  # "l0" | "l1" | "l2" -> cumulative hits; "miss" -> misses
    load: ReplicaLoadView | None  # None: never reported
    # why it is out of rotation ("stale report: ...", "the engine is hung: ..."); None: healthy
    down_reason: str | None = None
    # the name the fleet's router places by (its deployment rank: "rank-0", ..); None: one
    # server, or a fleet replica that reported no rank
    placement: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "replica_id": self.replica_id,
            "placement": self.placement,
            "healthy": self.healthy,
            "report_age_s": self.report_age_s,
            "tiers": {name: t.to_json() for name, t in self.tiers.items()},
            "hits": dict(self.hits),
            "load": self.load.to_json() if self.load is not None else None,
            "down_reason": self.down_reason,
        }


@dataclass(frozen=True)
class FleetState:
    """Every replica and the router's decisions by reason (cumulative)."""

    at_s: float  # unix time of this view
    policy: str | None  # the routing policy's name; None: one replica, no routing
    replicas: tuple[ReplicaState, ...]
    decisions: Mapping[str, int] = field(default_factory=dict)  # reason -> decisions

    def to_json(self) -> dict[str, Any]:
        return {
            "at_s": self.at_s,
            "policy": self.policy,
            "replicas": [r.to_json() for r in self.replicas],
            "decisions": dict(self.decisions),
        }


class FleetStateSource(Protocol):
    """What ``/admin/fleet`` reads (the fleet's ingress; ``LocalFleetState`` for one server)."""

    def fleet_state(self) -> FleetState: ...


def tiers_of(summary: CacheSummary) -> dict[str, TierOccupancy]:
    """A cache summary's occupancy of L0, L1 and L2."""
    tiers = {}
    for name, tier in zip(CACHED_TIER_NAMES, (Tier.L0, Tier.L1, Tier.L2), strict=True):
        tiers[name] = TierOccupancy(
            count=summary.num_copies.get(tier, 0),
            used_bytes=summary.used_bytes.get(tier, 0),
            capacity_bytes=summary.capacity_bytes.get(tier, 0),
            tenant_default_max_bytes=summary.default_tenant_bytes.get(tier),
        )
    return tiers


def hits_of(summary: CacheSummary) -> dict[str, int]:
    """A cache summary's cumulative hits per tier and misses."""
    hits = summary.stats.hits
    out = {
        name: hits.get(tier, 0)
        for name, tier in zip(CACHED_TIER_NAMES, (Tier.L0, Tier.L1, Tier.L2), strict=True)
    }
    out["miss"] = summary.stats.misses
    return out


def no_hits() -> dict[str, int]:
    """The hits of a replica whose cache cannot be read (none, or its engine is down)."""
    return {**dict.fromkeys(CACHED_TIER_NAMES, 0), "miss": 0}
