"""The eviction policy's seam: what a policy may know of a copy and what it must answer.

Torch-free. Separate from the policies themselves (``policy``, ``admit_policy``) so that each
policy module imports the seam, and the registry in ``policy`` imports every policy, one way.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from loraplex.artifacts.identity import AdapterKey
from loraplex.residency.ledger import Tier
from loraplex.residency.warm import RequestRates

# A victim's sort key: compared lexicographically, the smallest goes first; it ends with the
# adapter key, so no two copies of one tier tie.
OrderKey: TypeAlias = tuple[object, ...]
# Relative slack of a keep-score floor: absorbs the float rounding of two evaluations (exp and
# the products are monotone only up to an ulp) so the floor stays below the exact score.
FLOOR_SLACK = 1e-9
# Relative margin before the end of a copy's youth at which its youth group lapses: the float
# test ``now - loaded < min_residency`` is still true everywhere before it.
YOUTH_SLACK = 1e-9


@dataclass(frozen=True)
class Candidate:
    """What a policy may know about one adapter in one tier."""

    key: AdapterKey  # the adapter revision
    size_bytes: int  # bytes it holds in this tier
    loaded_at_s: float  # when it entered this tier
    last_access_s: float  # last request for it
    rates: RequestRates  # rolling request rates
    priority: float  # its tenant's priority (1.0 = normal)
    reload_cost_s: float  # time to bring it back from the tier it would fall to
    # Rates of the requests that read this tier (missed every faster one). None in L0, where
    # every request reads it (``rates``), and where a caller does not know them.
    reads: RequestRates | None = None
    # The tier the copy is in; None where a caller does not say (tests, the planner).
    tier: Tier | None = None


@dataclass(frozen=True)
class OrderGroup:
    """Copies whose relative victim order stays fixed for a while (see ``order_group``)."""

    group: Hashable  # equal for the members of one group
    rank: OrderKey  # orders the members of a group as ``order_key`` does, while the group holds
    until_s: float  # the group holds before then (math.inf: until the copy's inputs change)


class EvictionPolicy(Protocol):
    """Orders eviction candidates of one tier; time comes from the arguments (injected clock)."""

    name: str

    def order_key(self, c: Candidate, now_s: float) -> OrderKey:
        """The sort key of ``c`` at ``now_s`` (most evictable smallest). It must not fall when
        ``c``'s rates or ``reload_cost_s`` rise: the cache bounds it from below with the lowest
        values those inputs can take before the bound is renewed. It ends in ``c.key``, so keys
        never tie (the victim index and a small tier's sort then give one order)."""
        ...

    def order_key_floor(self, c: Candidate, now_s: float, until_s: float) -> OrderKey:
        """A key no greater than ``order_key(c2, t)`` for every ``t`` in [``now_s``,
        ``until_s``] and every ``c2`` equal to ``c`` except for rates and ``reload_cost_s`` no
        lower than ``c``'s. The cache passes ``c`` with the rates decayed to ``until_s`` (an idle
        copy's rates only fall) and the lowest reload cost it allows until then."""
        ...

    def order_group(self, c: Candidate, now_s: float) -> OrderGroup | None:
        """A group such that for any two candidates of one group, at every ``t`` in [``now_s``,
        both ``until_s``), ``order_key`` orders them as their ranks do, given rates as of ``t``
        (an idle copy's only fall) and any one ``reload_cost_s`` shared by both (the cache
        prices the members of a group at one bandwidth). None: the copy is bounded alone."""
        ...

    def order_victims(self, candidates: Sequence[Candidate], now_s: float) -> list[Candidate]:
        """All candidates, most evictable first (sorted by ``order_key``)."""
        ...

    def deferral_s(
        self,
        incoming: Candidate,
        victims: Sequence[Candidate],
        held: Sequence[Candidate],
        waited_s: float,
        now_s: float,
    ) -> float:
        """How much longer a demand load should wait for room rather than displace ``victims``
        now (0: displace now). ``held`` are the tier's other unpinned copies: in use, still
        loading, or too young to evict (they may become victims soon); ``waited_s`` is how long
        the load's longest-waiting request has waited since it asked (queueing and earlier
        moves included), so a policy's bound on it bounds the deferral per request. The cache
        caps any answer at ``CacheConfig.max_request_deferral_s`` minus ``waited_s``."""
        ...

    def admits(self, incoming: Candidate, victims: Sequence[Candidate], now_s: float) -> bool:
        """Whether an optional load (prefetch, promotion) may displace ``victims``."""
        ...
