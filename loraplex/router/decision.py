"""The typed seam between a caller (the Ray Serve request router, the simulator) and a policy."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from loraplex.router.view import ReplicaView


class Reason(StrEnum):
    """Why a replica was chosen; a fixed set, so it can label a metric."""

    MERGED = "merged"  # the revision is merged into its base weights (no LoRA work there)
    GPU_HIT = "gpu_hit"  # the revision is in its GPU slots
    CPU_HIT = "cpu_hit"  # in its CPU tier
    DISK_HIT = "disk_hit"  # on its disk
    SESSION = "session"  # the session's replica, not saturated
    PLACEMENT = "placement"  # a cold revision's placement set, or where it is being loaded
    SATURATED = "saturated"  # load won: every replica holding the revision is saturated
    WIDENED = "widened"  # a cold revision's placement set, widened because it was saturated
    # every replica within the revision's reach is saturated, not yet for ``spread_after_s``:
    # it waits at the best of them instead of loading into another replica's slots
    REACH_FULL = "reach_full"
    # another revision's cold load on a replica dedicated to a revision (``router/topology.py``):
    # every other replica is saturated
    DEDICATED_SPILL = "dedicated_spill"
    POW2 = "pow2"  # power of two choices (the base model, or the pow2 policy)
    MULTIPLEX = "multiplex"  # Ray Serve multiplexing found the model loaded there
    NO_REPORT = "no_report"  # no replica has a fresh report: power of two choices on own counts


@dataclass(frozen=True)
class RouteRequest:
    """What the router needs to know about one request."""

    adapter_key: str | None  # the revision's key (``str(AdapterKey)``); None for the base model
    session_key: str | None  # the OpenAI ``user`` or session id; None when absent
    num_prompt_tokens: int  # prompt length, added to the chosen replica's load until it reports
    # the caller's tenant (None: none named): whose share of the session table a session takes
    tenant: str | None = None

    def __post_init__(self) -> None:
        if self.adapter_key is not None and not self.adapter_key:
            raise ValueError("adapter_key '' is invalid; expected a revision key or None")
        if self.session_key is not None and not self.session_key:
            raise ValueError("session_key '' is invalid; expected a session key or None")
        if self.tenant is not None and not self.tenant:
            raise ValueError("tenant '' is invalid; expected a tenant name or None")
        if isinstance(self.num_prompt_tokens, bool) or self.num_prompt_tokens < 0:
            raise ValueError(
                f"num_prompt_tokens {self.num_prompt_tokens!r} is invalid; expected >= 0"
            )


class Decision:
    """Every offered replica, best first; the caller tries them in order.

    The order past the first is made when ``ranked`` is first read, not with the decision: the
    simulator reads only the first, and sorting the rest of a 64-replica fleet was a tenth of
    each decision. NOTE: what the order is made from (the views, their remembered figures and
    the policy's ranks at the decision) never changes afterwards, so it is the order an eager
    sort gives; a policy's random draws are all made before the decision returns.
    """

    __slots__ = ("_order", "_ranked", "reason", "replica_id")

    def __init__(
        self, replica_id: str, reason: Reason, order: Callable[[], tuple[str, ...]]
    ) -> None:
        self.replica_id = replica_id  # the first of ``ranked``
        self.reason = reason  # why ``replica_id`` came first
        self._order: Callable[[], tuple[str, ...]] | None = order  # makes ``ranked``, once
        self._ranked: tuple[str, ...] | None = None

    @property
    def ranked(self) -> tuple[str, ...]:
        """Replica ids, a permutation of those offered, ``replica_id`` first."""
        if self._ranked is None:
            assert self._order is not None  # dropped only once ``_ranked`` is made
            self._ranked, self._order = self._order(), None
        return self._ranked

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Decision):
            return NotImplemented
        return (self.ranked, self.reason) == (other.ranked, other.reason)

    def __hash__(self) -> int:
        return hash((self.ranked, self.reason))

    def __repr__(self) -> str:
        return f"Decision(ranked={self.ranked!r}, reason={self.reason!r})"


class RoutingPolicy(Protocol):
    """Ranks replicas for one request. ``fleet`` is sorted by replica id and never empty."""

    name: str

    def rank(
        self, request: RouteRequest, fleet: Sequence[ReplicaView], now_s: float
    ) -> Decision: ...


def by_ongoing(views: Sequence[ReplicaView]) -> list[ReplicaView]:
    return sorted(views, key=lambda v: (v.num_ongoing, v.replica_id))


def pow2(views: Sequence[ReplicaView], rng: random.Random) -> list[ReplicaView]:
    """Power of two choices, as Ray Serve's default router does it: two replicas drawn at
    random, the one with fewer ongoing requests first (the first drawn on a tie), then the
    rest by ongoing requests."""
    if len(views) < 2:
        return list(views)
    a, b = rng.sample(range(len(views)), 2)
    first, second = views[a], views[b]
    if second.num_ongoing < first.num_ongoing:
        first, second = second, first
    rest = by_ongoing([v for i, v in enumerate(views) if i not in (a, b)])
    return [first, second, *rest]


def decision(head: Sequence[ReplicaView], fleet: Sequence[ReplicaView], reason: Reason) -> Decision:
    """``head`` in its order, then the rest of ``fleet`` by ongoing requests."""
    ranked = _ranked(head, fleet)
    return Decision(ranked[0], reason, lambda: ranked)


def lazy_decision(
    first: ReplicaView,
    rest: Callable[[], Sequence[ReplicaView]],
    fleet: Sequence[ReplicaView],
    reason: Reason,
) -> Decision:
    """``decision([first, *rest()], fleet, reason)``, ``rest`` called only if the ranking past
    the first is read (``Decision``)."""
    return Decision(first.replica_id, reason, lambda: _ranked([first, *rest()], fleet))


def _ranked(head: Sequence[ReplicaView], fleet: Sequence[ReplicaView]) -> tuple[str, ...]:
    chosen = {v.replica_id for v in head}
    rest: list[ReplicaView] = []
    if len(chosen) < len(fleet):  # ``head`` is drawn from ``fleet``: else it names them all
        rest = by_ongoing([v for v in fleet if v.replica_id not in chosen])
    return tuple(v.replica_id for v in (*head, *rest))


def no_report(fleet: Sequence[ReplicaView], rng: random.Random) -> Decision:
    """The fallback of every report-driven policy while no replica has a fresh report."""
    return decision(pow2(fleet, rng), fleet, Reason.NO_REPORT)
