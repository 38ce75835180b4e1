"""Eviction policies: which resident adapters a tier gives up first.

Torch-free (the simulator reuses them). A policy only orders candidates and judges optional
displacements; the invariants that hold under every policy (pinned and in-use adapters are
never evicted, tenant budgets, capacity, load-before-displace) are enforced by the ledger and
the cache, which never hand such entries to a policy as candidates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from loraplex.artifacts.identity import AdapterKey
from loraplex.residency.admit_policy import AdmitGdsfPolicy
from loraplex.residency.policy_base import (
    FLOOR_SLACK,
    YOUTH_SLACK,
    Candidate,
    EvictionPolicy,
    OrderGroup,
    OrderKey,
)
from loraplex.residency.tiered_policy import TieredGdsfFetchPolicy, TieredGdsfPolicy

__all__ = [
    "DEFAULT_POLICY",
    "AdmitGdsfPolicy",
    "Candidate",
    "CostAwareConfig",
    "CostAwarePolicy",
    "EvictionPolicy",
    "LruPolicy",
    "LruPriorityPolicy",
    "OrderGroup",
    "OrderKey",
    "TieredGdsfFetchPolicy",
    "TieredGdsfPolicy",
    "make_policy",
    "policy_names",
    "register_policy",
]


class LruPolicy:
    """vLLM's LoRA residency: least recently used first; every displacement allowed."""

    name = "lru"

    def order_key(self, c: Candidate, now_s: float) -> OrderKey:
        return (c.last_access_s, c.key)

    def order_key_floor(self, c: Candidate, now_s: float, until_s: float) -> OrderKey:
        return self.order_key(c, now_s)  # constant until the next access

    def order_group(self, c: Candidate, now_s: float) -> OrderGroup | None:
        return None  # the key is constant: its floor is exact, nothing to gain from a group

    def order_victims(self, candidates: Sequence[Candidate], now_s: float) -> list[Candidate]:
        return sorted(candidates, key=lambda c: self.order_key(c, now_s))

    def admits(self, incoming: Candidate, victims: Sequence[Candidate], now_s: float) -> bool:
        return True

    def deferral_s(
        self,
        incoming: Candidate,
        victims: Sequence[Candidate],
        held: Sequence[Candidate],
        waited_s: float,
        now_s: float,
    ) -> float:
        return 0.0


class LruPriorityPolicy(LruPolicy):
    """LRU within priority classes: a lower-priority tenant's copy goes before any copy of a
    higher one, least recently used first within a class; never defers, admits everything.

    The control for ``cost_aware``: it sees the same tenant priority, so a gain of cost_aware
    over this policy is the keep-score's (frequency, reload cost, deferral), not the priority
    information that plain ``lru`` ignores by design."""

    name = "lru_priority"

    def order_key(self, c: Candidate, now_s: float) -> OrderKey:
        # NOTE: constant until the next access or a change of tenant priority (which makes the
        # cache rebuild its victim order), so LRU's exact floor and its absent groups still hold.
        return (c.priority, c.last_access_s, c.key)


@dataclass(frozen=True)
class CostAwareConfig:
    """Weights of the cost-aware keep-score."""

    min_residency_s: float = 0.25  # younger entries go only when nothing else can
    hysteresis: float = 0.25  # an optional load must beat its victims' score by this fraction
    recency_tau_s: float = 60.0  # recency term 1 / (age + tau): bounded for just-used adapters
    short_weight: float = 0.7  # weight of the 1-minute rate against the 5-minute one
    # A demand load of a lower-priority tenant waits for a held-back copy (in use, loading or
    # too young) worth less than its victims to become evictable, rather than displace a
    # higher-priority tenant's copy worth far more (a batch tenant's burst of one-off adapters
    # then cycles through the slots its own requests hold, not the hot set), until its request
    # has waited this long in total since it asked: deferral never starves a request.
    demand_defer_s: float = 0.5

    def __post_init__(self) -> None:
        if self.min_residency_s < 0:
            raise ValueError(f"min_residency_s {self.min_residency_s} is invalid; expected >= 0")
        if self.hysteresis < 0:
            raise ValueError(f"hysteresis {self.hysteresis} is invalid; expected >= 0")
        if self.demand_defer_s < 0:
            raise ValueError(f"demand_defer_s {self.demand_defer_s} is invalid; expected >= 0")
        if self.recency_tau_s <= 0:
            raise ValueError(f"recency_tau_s {self.recency_tau_s} is invalid; expected > 0")
        if not 0 <= self.short_weight <= 1:
            raise ValueError(f"short_weight {self.short_weight} is invalid; expected in [0, 1]")


class CostAwarePolicy:
    """Keeps what is expensive to lose per byte held (GreedyDual-Size-Frequency flavoured).

    keep = priority x (request rate + recency) x reload_cost_s / size_bytes: the reload seconds
    an adapter is expected to save per second and per byte of capacity it occupies. The rate
    blends the 1- and 5-minute windows, so a burst of one-off adapters (rate ~ 1/window) scores
    far below a steadily used one, while a rotated hot set is recognised within about a minute.

    ``reload_cost_s`` is the cost of refilling *this* tier (a fixed per-miss stall plus the
    bytes the refilling move reads over its source's bandwidth; see ``ReloadCosts``). With
    uniform slots the L0 ordering is therefore frequency x priority (LFU with decay, which beats
    LRU when popularity is skewed), and in the byte-budgeted tiers the fixed stall favours
    small adapters at equal rates (more hits per byte), as GDSF does.
    """

    name = "cost_aware"

    def __init__(self, config: CostAwareConfig | None = None) -> None:
        self.config = config or CostAwareConfig()

    def keep_score(self, c: Candidate, now_s: float) -> float:
        cfg = self.config
        rate = self._rate(c)
        recency = 1.0 / (max(0.0, now_s - c.last_access_s) + cfg.recency_tau_s)
        return c.priority * (rate + recency) * c.reload_cost_s / max(1, c.size_bytes)

    def order_key(self, c: Candidate, now_s: float) -> tuple[bool, float, float, AdapterKey]:
        young = now_s - c.loaded_at_s < self.config.min_residency_s
        return (young, self.keep_score(c, now_s), c.last_access_s, c.key)

    def order_key_floor(self, c: Candidate, now_s: float, until_s: float) -> OrderKey:
        """Both terms fall with time: an idle copy's rates decay (``c`` holds them at
        ``until_s``) and recency 1 / (age + tau) shrinks, so the score at ``until_s`` bounds
        every earlier one (given priority >= 0). A copy young now is old by ``until_s`` if
        ``young`` flips on the way: False < True, so the flag at ``until_s`` is the floor."""
        young = until_s - c.loaded_at_s < self.config.min_residency_s
        score = self.keep_score(c, until_s)
        return (young, score - abs(score) * FLOOR_SLACK, c.last_access_s, c.key)

    def order_group(self, c: Candidate, now_s: float) -> OrderGroup | None:
        """Copies with a zero request rate (it stays zero until a request: rates only decay)
        score W / (age + tau) with W from priority, reload cost and size: given one W, a lower
        last access never scores higher (each float step is monotone), and equal scores fall
        to ``order_key``'s tie-breakers, last access then key. So (last access, key) ranks the
        members of a group of equal W inputs and equal youth, for as long as the youth holds:
        for good once old, until just before the end of ``min_residency_s`` while young."""
        if self._rate(c) != 0.0:
            return None
        weight = (c.priority, c.reload_cost_s, max(1, c.size_bytes))
        rank = (c.last_access_s, c.key)
        min_residency_s = self.config.min_residency_s
        if not now_s - c.loaded_at_s < min_residency_s:
            return OrderGroup((False, *weight), rank, math.inf)
        margin = YOUTH_SLACK * (abs(c.loaded_at_s) + min_residency_s)
        until_s = c.loaded_at_s + min_residency_s - margin
        return OrderGroup((True, *weight), rank, until_s) if until_s > now_s else None

    def order_victims(self, candidates: Sequence[Candidate], now_s: float) -> list[Candidate]:
        return sorted(candidates, key=lambda c: self.order_key(c, now_s))

    def _rate(self, c: Candidate) -> float:
        """The blended request rate of the keep-score."""
        weight = self.config.short_weight
        return weight * c.rates.per_1m + (1 - weight) * c.rates.per_5m

    def admits(self, incoming: Candidate, victims: Sequence[Candidate], now_s: float) -> bool:
        if not victims:
            return True
        bar = max(self.keep_score(v, now_s) for v in victims) * (1 + self.config.hysteresis)
        return self.keep_score(incoming, now_s) > bar

    def deferral_s(
        self,
        incoming: Candidate,
        victims: Sequence[Candidate],
        held: Sequence[Candidate],
        waited_s: float,
        now_s: float,
    ) -> float:
        """Wait out the rest of ``demand_defer_s`` (per request, counted from when the request
        asked) when a victim of a higher-priority tenant is
        worth more than the newcomer by the hysteresis margin and a cheaper copy is held back
        (in use, loading or too young). Within one priority class loads never wait (a rotating
        hot set must be able to displace the old one at once)."""
        left = self.config.demand_defer_s - waited_s
        above = [v for v in victims if v.priority > incoming.priority]
        if left <= 0 or not above or not held:
            return 0.0
        protect = max(self.keep_score(v, now_s) for v in above)
        if self.keep_score(incoming, now_s) * (1 + self.config.hysteresis) >= protect:
            return 0.0
        return left if min(self.keep_score(c, now_s) for c in held) < protect else 0.0


_POLICIES: dict[str, Callable[[], EvictionPolicy]] = {}


def register_policy(name: str, factory: Callable[[], EvictionPolicy]) -> None:
    """Adds a policy by name; a second registration under one name is refused."""
    if name in _POLICIES:
        raise ValueError(f"eviction policy {name!r} is already registered")
    _POLICIES[name] = factory


def make_policy(name: str) -> EvictionPolicy:
    """A fresh policy by name (``lru``, ``lru_priority``, ``cost_aware``, ``admit_gdsf``,
    ``tiered_gdsf``, ``tiered_gdsf_fetch``)."""
    if name not in _POLICIES:
        raise ValueError(f"eviction policy {name!r} is unknown; expected one of {policy_names()}")
    return _POLICIES[name]()


def policy_names() -> tuple[str, ...]:
    return tuple(sorted(_POLICIES))


DEFAULT_POLICY = "cost_aware"
register_policy("lru", LruPolicy)
register_policy("lru_priority", LruPriorityPolicy)
register_policy("cost_aware", CostAwarePolicy)
register_policy("admit_gdsf", AdmitGdsfPolicy)
register_policy("tiered_gdsf", TieredGdsfPolicy)
register_policy("tiered_gdsf_fetch", TieredGdsfFetchPolicy)
