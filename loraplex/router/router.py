"""``Router``: the replica choice for one request, by a named policy, over replica reports.

Torch-free and Ray-free: the Ray Serve request router, the simulator and the benchmarks call the
same ``choose``. Time and randomness are injected, so a seeded run decides identically.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, KeysView, Mapping
from dataclasses import fields
from itertools import compress
from operator import is_not
from typing import TypeAlias

from loraplex.clock import Clock
from loraplex.errors import quoted
from loraplex.router.affinity import AffinityPolicy, AffinityUntilSaturatedPolicy
from loraplex.router.baselines import Pow2Policy, RayMultiplexPolicy
from loraplex.router.config import RouterConfig
from loraplex.router.decision import Decision, RouteRequest, RoutingPolicy
from loraplex.router.memory import DecisionMemory, Entry
from loraplex.router.reports import ReplicaReport
from loraplex.router.topology import Dedication
from loraplex.router.view import ReplicaView, held_keys

DEFAULT_POLICY = "affinity_until_saturated"

PolicyFactory: TypeAlias = Callable[[RouterConfig, random.Random], RoutingPolicy]
_POLICIES: dict[str, PolicyFactory] = {}


def register_policy(name: str, factory: PolicyFactory) -> None:
    """Adds a policy under ``name``; a name is registered once (a second is an error)."""
    if name in _POLICIES:
        raise ValueError(f"routing policy {name!r} is already registered")
    _POLICIES[name] = factory


def policy_names() -> tuple[str, ...]:
    return tuple(sorted(_POLICIES))


# RouterConfig fields the Router reads whatever its policy (report age, its own decisions).
ROUTER_READS = frozenset({"max_report_age_s", "recent_ttl_s"})


def unread_router_keys(policy_name: str, keys: Iterable[str]) -> list[str]:
    """The RouterConfig fields among ``keys`` that neither ``policy_name`` nor the Router reads
    (a policy without a ``reads`` set reads them all: ``affinity_until_saturated``)."""
    reads = getattr(_POLICIES[policy_name], "reads", None)
    if reads is None:
        return []
    return sorted(set(keys) - reads - ROUTER_READS)


ROUTER_KEYS = sorted(f.name for f in fields(RouterConfig))


def router_config(policy_name: str, overrides: object) -> RouterConfig:
    """``RouterConfig`` with ``overrides`` (the fleet's ``router`` table, the simulator's
    ``SimConfig.router``): a non-table, an unknown key, a value ``RouterConfig`` refuses, or a
    key ``policy_name`` does not read is refused naming it (the fleet and the simulator refuse
    the same table alike)."""
    if not isinstance(overrides, Mapping):
        raise ValueError(f"router {overrides!r} is invalid; expected a table of RouterConfig keys")
    unknown = sorted(str(k) for k in overrides if k not in ROUTER_KEYS)
    if unknown:
        raise ValueError(f"router keys {unknown} are unknown; expected some of {ROUTER_KEYS}")
    config = RouterConfig(**overrides)  # raises naming a wrong value
    if policy_name not in _POLICIES:
        raise ValueError(
            f"routing policy {policy_name!r} is unknown; expected one of {policy_names()}"
        )
    unread = unread_router_keys(policy_name, overrides)
    if unread:
        raise ValueError(
            f"router keys {unread} are not read by the routing policy {policy_name!r}; "
            "expected them left out, or a policy that reads them "
            "(affinity_until_saturated reads every router key)"
        )
    return config


def follows_dedication(policy_name: str) -> bool:
    """Whether ``policy_name`` sends a dedicated revision's traffic to the replica the fleet's
    topology dedicated (and merged) it on: the affinity policies do; Ray Serve's baselines,
    which declare ``follows_dedication`` false, do not."""
    return bool(getattr(_POLICIES[policy_name], "follows_dedication", True))


for _factory in (Pow2Policy, RayMultiplexPolicy, AffinityPolicy, AffinityUntilSaturatedPolicy):
    register_policy(_factory.name, _factory)


class Router:
    """Ranks replicas for each request and remembers its own decisions between reports."""

    def __init__(
        self,
        policy_name: str = DEFAULT_POLICY,
        config: RouterConfig | None = None,
        *,
        clock: Clock,
        rng: random.Random,
    ) -> None:
        if policy_name not in _POLICIES:
            raise ValueError(
                f"policy_name {quoted(policy_name)} is unknown; expected one of {policy_names()}"
            )
        self.config = config or RouterConfig()
        self.policy: RoutingPolicy = _POLICIES[policy_name](self.config, rng)
        self._clock = clock
        self._memory = DecisionMemory(self.config.recent_ttl_s)
        self._views: dict[str, ReplicaView] = {}  # the last view of each replica (``view``)
        # each replica's last report seen by ``view`` (None: none or stale), with its held keys
        self._held: dict[str, tuple[ReplicaReport | None, frozenset[str] | None]] = {}
        # the replica the fleet dedicated to one revision (``FleetTopology.update``); None: none
        self.dedication: Dedication | None = None
        self._last: _LastView | None = None  # what the last ``view`` saw (None: look at all)
        self._touched: str | None = None  # the replica a decision went to since then
        self._offered: set[str] = set()  # the replica ids of the last decision
        # the last decision's remembered destination (replica id, entry): ``choose(replaces=)``
        self.last_mark: tuple[str, Entry] | None = None

    def view(self, replicas: Mapping[str, ReplicaReport | None]) -> list[ReplicaView]:
        """What the router believes of each replica now (sorted by id): its report unless
        stale, merged with the decisions made since."""
        now_s = self._clock.now()
        last = self._last
        if (
            last is None
            or now_s >= last.due_s
            or last.dedication is not self.dedication
            or replicas.keys() != last.offered
        ):
            return self._view_all(replicas, now_s)
        # NOTE: only the replicas whose view may differ from the last call's are looked at (a
        # new report object, a decision routed there since), the rest are the same views: a
        # view changes with time alone only from ``due_s`` on, when every one is looked at.
        reports = list(map(replicas.__getitem__, last.ids))
        changed = list(compress(range(len(reports)), map(is_not, reports, last.reports)))
        touched = self._touched
        if touched is not None:
            self._touched = None
            changed.append(last.index[touched])
        views = last.views
        for i in changed:
            last.reports[i] = reports[i]
            views[i] = self._view_one(last.ids[i], reports[i], now_s, last)
        return list(views)

    def _view_all(
        self, replicas: Mapping[str, ReplicaReport | None], now_s: float
    ) -> list[ReplicaView]:
        """``view`` with every replica looked at; remembers what the next call needs."""
        ids = sorted(replicas)
        last = _LastView(ids, replicas.keys(), self.dedication)
        self._touched = None
        for replica_id in ids:
            report = replicas[replica_id]
            last.reports.append(report)
            last.views.append(self._view_one(replica_id, report, now_s, last))
        self._last = last
        return list(last.views)

    def _view_one(
        self, replica_id: str, report: ReplicaReport | None, now_s: float, last: _LastView
    ) -> ReplicaView:
        """One replica's view now; lowers ``last.due_s`` to when it may change with time."""
        max_age_s = self.config.max_report_age_s
        if report is not None and report.replica_id != replica_id:
            raise ValueError(
                f"replicas[{quoted(replica_id)}] is a report of "
                f"{quoted(report.replica_id)}; expected the same replica id"
            )
        if report is not None:
            if now_s - report.at_s > max_age_s:
                report = None
            else:
                last.lower_due(report.at_s + max_age_s)
        pending = self._memory.pending(replica_id, None if report is None else report.at_s, now_s)
        first_s = self._memory.first_s(replica_id)
        if first_s is not None:
            last.lower_due(first_s + self.config.recent_ttl_s)
        dedicated = None
        dedication = self.dedication
        if dedication is not None and dedication.replica_id == replica_id:
            dedicated = dedication.adapter_key
        view = self._views.get(replica_id)
        # NOTE: a view is a pure function of these three (the memory hands out the same
        # ``Pending`` while no decision for the replica came or lapsed), so one that was
        # built from the very same objects is still true; any other is rebuilt.
        if (
            view is None
            or view.report is not report
            or view.pending is not pending
            or view.dedicated != dedicated
        ):
            held = self._held_keys(replica_id, report)
            view = self._views[replica_id] = ReplicaView(
                replica_id, report, pending, dedicated, held
            )
        return view

    def _held_keys(self, replica_id: str, report: ReplicaReport | None) -> frozenset[str] | None:
        """``held_keys(report)``, joined once per report, not once per view built on it."""
        known = self._held.get(replica_id)
        if known is None or known[0] is not report:
            known = self._held[replica_id] = (report, held_keys(report))
        return known[1]

    def choose(
        self,
        request: RouteRequest,
        replicas: Mapping[str, ReplicaReport | None],
        *,
        replaces: tuple[str, Entry] | None = None,
    ) -> Decision:
        """The ranked replica ids for ``request`` among ``replicas`` (id → latest report, None
        when it has not reported), and why the first came first. The first is remembered as
        this request's destination until that replica reports again (its mark: ``last_mark``).
        ``replaces``: the same request's mark from an earlier choice that did not take (Ray's
        backoff asks), forgotten first, so a request counts as pending on one replica only."""
        if not replicas:
            raise ValueError("replicas is empty; expected at least one replica id")
        if replaces is not None:
            self._memory.withdraw(*replaces)
            self._last = None  # that replica's view changed too: every one is looked at
        if replicas.keys() != self._offered:  # the fleet changed since the last decision
            offered = self._offered = set(replicas)
            self._memory.forget_except(offered)
            for gone in [r for r in self._views if r not in offered]:
                del self._views[gone], self._held[gone]
        now_s = self._clock.now()
        result = self.policy.rank(request, self.view(replicas), now_s)
        entry = self._memory.record(
            result.replica_id, request.adapter_key, request.num_prompt_tokens, now_s
        )
        self.last_mark = (result.replica_id, entry)
        self._touched = result.replica_id
        return result

    def withdraw(self, mark: tuple[str, Entry]) -> None:
        """Forgets a decision (its ``last_mark``) whose request left without its replica taking
        any work for it: refused or cancelled before its first token, or its replica lost. A
        no-op once it lapsed. NOTE: kept, such a decision counted as the replica's load until
        its next report, so a tenant sending requests it cancelled at once made a replica look
        saturated with work it never did."""
        self._memory.withdraw(*mark)
        self._last = None  # that replica's view changed: every one is looked at

    def finish(self, mark: tuple[str, Entry]) -> None:
        """A decision (its ``last_mark``) whose request ended on its replica: no longer load
        there, still its revision's (``DecisionMemory.finish``). A no-op once it lapsed."""
        self._memory.finish(*mark)
        self._last = None  # that replica's view changed: every one is looked at


# Times within this of a view's change are treated as past it (``_LastView.due_s``): looking at a
# replica early costs a little; late would read a stale view. Float rounding is far below this.
_DUE_MARGIN_S = 1e-6


class _LastView:
    """What ``Router.view`` saw last: the offered ids (sorted) and their reports and views, and
    the first time any of those views may change with time alone (a report turning stale, a
    decision lapsing by ``recent_ttl_s``)."""

    __slots__ = ("dedication", "due_s", "ids", "index", "offered", "reports", "views")

    def __init__(
        self, ids: list[str], offered: KeysView[str], dedication: Dedication | None
    ) -> None:
        self.ids = ids
        self.index = {r: i for i, r in enumerate(ids)}
        self.offered = set(offered)
        self.dedication = dedication
        self.reports: list[ReplicaReport | None] = []
        self.views: list[ReplicaView] = []
        self.due_s = math.inf

    def lower_due(self, at_s: float) -> None:
        self.due_s = min(self.due_s, at_s - _DUE_MARGIN_S)
