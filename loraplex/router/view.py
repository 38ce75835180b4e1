"""The router's view of one replica: its fresh report (if any) merged with the router's own
decisions since that report, and the score and saturation rules over it.

Every policy reads replicas only through ``ReplicaView``, so "what the router believes" is
decided here alone. A view is a pure function of (report, pending decisions, dedication), so the
router reuses one across decisions while those three are the same objects; what a view
computes (tiers, utilization, load penalty) it remembers for as long as it lives.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import IntEnum
from itertools import compress, repeat
from operator import and_, contains, is_not, or_

from loraplex.router.config import RouterConfig
from loraplex.router.memory import Pending
from loraplex.router.reports import ReplicaReport


class Tier(IntEnum):
    """Where a replica holds a revision, slowest first (comparisons follow speed)."""

    ABSENT = 0
    L2 = 1  # local disk
    L1 = 2  # CPU
    LOADING = 3  # on its way to L0, or routed there since the last report
    L0 = 4  # GPU slots


MAX_TIERS_CACHED = 4096  # revisions whose tier one view remembers (then it forgets them all)


class ReplicaView:
    """One replica as the router sees it at decision time (read only).

    NOTE: a plain slotted class, not a frozen dataclass: building frozen dataclasses field by
    field took a tenth of a 64-replica simulation.
    """

    __slots__ = (
        "dedicated",
        "held",
        "holder_ranks",
        "load_ranks",
        "num_active_tokens",
        "num_adapter_wait",
        "num_ongoing",
        "num_queued",
        "penalties",
        "pending",
        "replica_id",
        "report",
        "tiers",
        "utilizations",
    )

    def __init__(
        self,
        replica_id: str,
        report: ReplicaReport | None,
        pending: Pending,
        dedicated: str | None = None,
        held: frozenset[str] | None = None,
    ) -> None:
        self.replica_id = replica_id  # the serving framework's replica id
        self.report = report  # its latest report, None when absent or stale
        self.pending = pending  # the router's decisions for it since that report
        # a revision the fleet asked this replica to merge (``router/topology.py``); None: none
        self.dedicated = dedicated
        # ``held_keys`` of the report (frozenset() without one), so ``holders`` tests one set;
        # None: not given, or a Bloom filter in the report (``holders`` asks ``tier_of``)
        self.held = held
        # The load it reports plus the router's decisions since, computed once (a decision
        # reads them hundreds of times over a large fleet).
        load = report.load if report else None
        queued = (load.num_queued if load else 0) + pending.num_requests
        self.num_queued = queued  # waiting requests: reported, plus those routed since
        # reported requests waiting for their adapter to load (not for a seat)
        self.num_adapter_wait = load.num_adapter_wait if load else 0
        # queued and running requests, those waiting for an adapter left out
        self.num_ongoing = queued + (load.num_running if load else 0)
        self.num_active_tokens = (load.num_active_tokens if load else 0) + pending.num_tokens
        # ``utilization`` per ``cold``, ``load_penalty`` and ``load_rank``, each with the config
        # it was computed for, and ``tier_of`` per revision asked: a decision asks for each once
        # per rule that reads it, and a reused view keeps them
        self.utilizations: dict[bool, tuple[RouterConfig, float]] = {}
        self.penalties: tuple[RouterConfig, float] | None = None
        self.load_ranks: tuple[RouterConfig, tuple[bool, float, str]] | None = None
        self.tiers: dict[str, Tier] = {}
        # ``holder_rank`` per revision asked, with the config they were computed for
        self.holder_ranks: tuple[RouterConfig, dict[str, tuple[bool, float, str]]] | None = None

    def __repr__(self) -> str:
        return f"ReplicaView({self.replica_id!r}, {self.report!r}, {self.pending!r})"

    @property
    def known(self) -> bool:
        """Whether a fresh report exists (unknown replicas rank after every known one)."""
        return self.report is not None

    def tier_of(self, adapter_key: str) -> Tier:
        """The fastest place this replica holds ``adapter_key``, by report or recent decision."""
        tiers = self.tiers
        tier = tiers.get(adapter_key)
        if tier is None:
            if len(tiers) >= MAX_TIERS_CACHED:  # a long-lived view asked for many revisions
                tiers.clear()
            tier = tiers[adapter_key] = self._tier_of(adapter_key)
        return tier

    def _tier_of(self, adapter_key: str) -> Tier:
        residency = self.report.residency if self.report else None
        if residency is not None and adapter_key in residency.l0:
            return Tier.L0
        if adapter_key in self.pending.adapter_keys:
            return Tier.LOADING
        if residency is None:
            return Tier.ABSENT
        for tier, keys in (
            (Tier.LOADING, residency.loading),
            (Tier.L1, residency.l1),
            (Tier.L2, residency.l2),
        ):
            if adapter_key in keys:
                return tier
        return Tier.ABSENT

    def is_pinned(self, adapter_key: str) -> bool:
        return self.report is not None and adapter_key in self.report.residency.pinned

    def is_merged(self, adapter_key: str) -> bool:
        """Whether the replica reported ``adapter_key`` merged into its base weights, or was
        dedicated to it (asked to merge it: its traffic is steered there before it lands)."""
        if adapter_key == self.dedicated:
            return True
        return self.report is not None and adapter_key in self.report.residency.merged


def held_keys(report: ReplicaReport | None) -> frozenset[str] | None:
    """Every revision ``report`` places in L0, loading, L1 or L2, as one set (empty without a
    report); None when one of those is a Bloom filter, which cannot be joined."""
    if report is None:
        return frozenset()
    r = report.residency
    joined: frozenset[str] = frozenset()
    for part in (r.l0, r.loading, r.l1, r.l2):
        if not isinstance(part, frozenset):
            return None
        joined |= part
    return joined


def holders(views: Sequence[ReplicaView], adapter_key: str) -> list[ReplicaView]:
    """The views that hold ``adapter_key`` anywhere (``tier_of`` above ABSENT), in order: one set
    lookup or two per view where ``held`` is known, instead of up to five."""
    found = []
    for view in views:
        held = view.held
        if held is None:
            if view.tier_of(adapter_key) > Tier.ABSENT:
                found.append(view)
        elif adapter_key in held or adapter_key in view.pending.adapter_keys:
            found.append(view)
    return found


def holder_rank(
    view: ReplicaView, adapter_key: str, config: RouterConfig
) -> tuple[bool, float, str]:
    """(saturated, -score, id): a replica's place among the holders of ``adapter_key``,
    remembered by the view (what it is made of never changes while the view lives)."""
    known = view.holder_ranks
    if known is None or known[0] is not config:
        known = view.holder_ranks = (config, {})
    ranks = known[1]
    rank = ranks.get(adapter_key)
    if rank is None:
        if len(ranks) >= MAX_TIERS_CACHED:  # a long-lived view asked for many revisions
            ranks.clear()
        rank = ranks[adapter_key] = (
            is_saturated(view, config),
            -score(view, adapter_key, config),
            view.replica_id,
        )
    return rank


class FleetScan:
    """Which views of a fleet have a report (``known``), are unsaturated (``open``) and hold a
    revision (``holders``), each in the fleet's order, as a policy reads them per decision.

    NOTE: between two decisions the router hands out the same view objects but for a few (the
    replica a decision went to, new reports), and what is read here never changes while a view
    lives: ``update`` looks only at the positions whose view is another object, and the lists
    are picked out of the fleet by remembered flags (``compress``) instead of a test per view.
    """

    def __init__(self, config: RouterConfig) -> None:
        self._config = config
        self._fleet: list[ReplicaView] = []
        self._known: list[bool] = []  # per position: a fresh report
        self._open: list[bool] = []  # per position: known and ``utilization`` below 1.0
        self._held: list[frozenset[str]] = []  # per position: ``held`` (frozenset() if None)
        self._pending: list[frozenset[str]] = []  # per position: ``pending.adapter_keys``
        self._unjoined: list[bool] = []  # per position: known, and ``held`` is None (Bloom)
        self._dedicated: dict[int, ReplicaView] = {}  # position -> a known view with ``dedicated``

    def update(self, fleet: Sequence[ReplicaView]) -> None:
        """Takes ``fleet`` (the views of this decision, in order) as the one read next."""
        n = len(fleet)
        changed: Iterable[int]
        if len(self._fleet) != n:
            self._known, self._open, self._unjoined = [False] * n, [False] * n, [False] * n
            self._held, self._pending = [frozenset()] * n, [frozenset()] * n
            self._dedicated = {}
            changed = range(n)
        else:
            changed = list(compress(range(n), map(is_not, fleet, self._fleet)))
        config = self._config
        for i in changed:
            view = fleet[i]
            known = view.report is not None
            held = view.held
            self._known[i] = known
            self._open[i] = known and utilization(view, config) < 1.0  # not ``is_saturated``
            self._held[i] = frozenset() if held is None else held
            self._unjoined[i] = known and held is None
            self._pending[i] = view.pending.adapter_keys
            if known and view.dedicated is not None:
                self._dedicated[i] = view
            else:
                self._dedicated.pop(i, None)
        self._fleet = list(fleet)

    def known(self) -> list[ReplicaView]:
        return list(compress(self._fleet, self._known))

    def open(self) -> list[ReplicaView]:
        return list(compress(self._fleet, self._open))

    def dedicated_to_another(self, adapter_key: str) -> ReplicaView | None:
        """The known view dedicated to a revision other than ``adapter_key`` (None: none)."""
        for view in self._dedicated.values():
            if view.dedicated != adapter_key:
                return view
        return None

    def holders(self, adapter_key: str) -> list[ReplicaView]:
        """``holders(known, adapter_key)``: the known views holding ``adapter_key``, in order."""
        if any(self._unjoined):
            return holders(self.known(), adapter_key)
        in_held = map(contains, self._held, repeat(adapter_key))
        in_pending = map(contains, self._pending, repeat(adapter_key))
        return list(compress(self._fleet, map(and_, self._known, map(or_, in_held, in_pending))))


def utilization(view: ReplicaView, config: RouterConfig, *, cold: bool = False) -> float:
    """Load as a fraction of the saturation point: 1.0 and above is saturated. The largest of the
    queue, ongoing and KV fractions (a full queue or KV cache stops new work from starting; many
    running sequences slow every step of every one of them).

    Requests waiting for their adapter to load delay a request whose revision is resident there
    not at all (it takes a seat at the next step), so they count only for a ``cold`` request,
    which would queue its own load behind theirs. Counting them for every request made a
    replica busy loading look saturated to its own resident revisions' traffic, which then went
    to replicas without them and caused more loads (measured: docs/benchmarks/fleet.md)."""
    known = view.utilizations.get(cold)
    if known is not None and known[0] is config:
        return known[1]
    kv_usage = view.report.load.kv_usage if view.report else 0.0
    queued = view.num_queued + (view.num_adapter_wait if cold else 0)
    value = max(
        queued / config.max_queued,
        view.num_ongoing / config.max_ongoing,
        kv_usage / config.max_kv_usage,
    )
    view.utilizations[cold] = (config, value)
    return value


def is_saturated(view: ReplicaView, config: RouterConfig, *, cold: bool = False) -> bool:
    return utilization(view, config, cold=cold) >= 1.0


def load_penalty(view: ReplicaView, config: RouterConfig) -> float:
    """What load subtracts from a replica's score (0 for an idle replica)."""
    known = view.penalties
    if known is not None and known[0] is config:
        return known[1]
    evictions = view.report.load.evictions_per_min if view.report else 0.0
    running = view.report.load.num_running if view.report else 0
    value = (
        config.penalty_per_queued * (view.num_queued + view.num_adapter_wait)
        + config.penalty_per_running * running
        + config.penalty_per_1k_active_tokens * view.num_active_tokens / 1000
        + config.penalty_per_eviction_per_min * evictions
    )
    view.penalties = (config, value)
    return value


def load_rank(view: ReplicaView, config: RouterConfig) -> tuple[bool, float, str]:
    """A replica's place when load alone orders it: unsaturated first, then the lower penalty,
    then the replica id. For a revision the replica does not hold this is the score order
    (``score`` is then ``0.0 - load_penalty``), so it is computed once per view, not per
    decision."""
    known = view.load_ranks
    if known is not None and known[0] is config:
        return known[1]
    value = (is_saturated(view, config), load_penalty(view, config), view.replica_id)
    view.load_ranks = (config, value)
    return value


def affinity(view: ReplicaView, adapter_key: str, config: RouterConfig) -> float:
    """The residency part of the score: the tier's weight, plus the pinned and merged
    bonuses (a merged revision runs there with no LoRA work: docs/modes.md)."""
    tier = view.tier_of(adapter_key)
    if tier is Tier.ABSENT:
        return 0.0
    # by tier value: L2 1, L1 2, LOADING 3, L0 4
    weights = (config.weight_l2, config.weight_l1, config.weight_loading, config.weight_l0)
    bonus = config.weight_pinned if view.is_pinned(adapter_key) else 0.0
    if tier is Tier.L0 and view.is_merged(adapter_key):
        bonus += config.weight_merged
    return weights[tier - 1] + bonus


def score(view: ReplicaView, adapter_key: str, config: RouterConfig) -> float:
    """Affinity minus load: higher is better."""
    return affinity(view, adapter_key, config) - load_penalty(view, config)
