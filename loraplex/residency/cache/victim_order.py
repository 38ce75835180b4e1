"""How a tier's victim index reads its copies: true keys, floors and order groups.

Torch-free. ``VictimOrder`` is the index's view of one tier; ``PolicyOrder`` implements it
through the eviction policy over the candidates ``TierState`` builds (the cache's reload-cost
model and request history).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from loraplex.artifacts.identity import AdapterKey
from loraplex.residency.ledger import ResidentEntry, Tier
from loraplex.residency.policy import Candidate, EvictionPolicy, OrderGroup, OrderKey

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

    def group(self, entry: ResidentEntry, now_s: float) -> OrderGroup | None:
        """The copy's group: for two copies of one group and every t in [``now_s``, both
        ``until_s``) (while their order inputs do not change, whatever the bandwidth estimate
        does), ``key`` orders them as their ranks do. None: the copy is bounded alone."""
        ...


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
        charged: str | None = None,
    ) -> Candidate:
        """The copy with rates as of ``at_s``, the reload cost at ``bandwidth`` and the
        priority of the tenant it is charged to (``charged``, None: the owner)."""
        ...

    def refill_bytes(self, key: AdapterKey, tier: Tier, size_bytes: int) -> int:
        """The bytes a refill of the copy reads (its reload cost at any bandwidth follows)."""
        ...


class PolicyOrder:
    """One tier's ``VictimOrder`` through the eviction policy.

    A floor is the policy's over a candidate with the rates an idle copy has left at
    ``until_s`` (they only decay) and the reload cost at a ceiling of the source tier's
    bandwidth estimate (costs only rise as bandwidth falls). The estimate moves with every
    measured fill, so the cache asks ``holds`` before each query (and ``reset``s when not).
    A group is the policy's plus the copy's refill bytes: members then share their reload cost
    at every bandwidth estimate, not only at the ceiling the policy saw."""

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
        return self._source.policy.order_key(self._candidate(entry, now_s), now_s)

    def floor(self, entry: ResidentEntry, now_s: float, until_s: float) -> OrderKey:
        candidate = self._ceiling_candidate(entry, until_s)
        return self._source.policy.order_key_floor(candidate, now_s, until_s)

    def group(self, entry: ResidentEntry, now_s: float) -> OrderGroup | None:
        grouped = self._source.policy.order_group(self._ceiling_candidate(entry, now_s), now_s)
        if grouped is None:
            return None
        refill = self._source.refill_bytes(entry.key, self._tier, entry.size_bytes)
        return replace(grouped, group=(grouped.group, refill))

    def _ceiling_candidate(self, entry: ResidentEntry, at_s: float) -> Candidate:
        return self._candidate(entry, at_s, self._ceiling)

    def _candidate(
        self, entry: ResidentEntry, at_s: float, bandwidth: float | None = None
    ) -> Candidate:
        """The copy as the policy sees it at ``at_s`` (priority: the tenant charged for it)."""
        return self._source.candidate_of(
            entry.key,
            self._tier,
            entry.size_bytes,
            entry.loaded_at_s,
            at_s=at_s,
            bandwidth=bandwidth,
            charged=entry.charged,
        )
