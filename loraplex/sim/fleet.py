"""The fleet's router in the simulator: the real ``router.Router`` choosing among simulated
replicas from their reports, as the Ray Serve request router does.

A replica's report (residency per tier from its cache's snapshot, load from its scheduler's
counts, evictions over the last minute) is built the way ``fleet.replica.routing_report``
builds it, and renewed at the first decision after ``report_interval_s`` has passed, so the
router decides on state up to one interval old and on its own decisions since, as it does live.

A report's ready sets are kept up to date from the cache's change log (``residency_changes``:
the keys whose ready tiers changed since the last report), not rebuilt from every cached copy:
a replica's L1 and L2 fill over a long run, and walking them at every report made the cost per
request grow with the run's length. The copies being loaded (L0's entries, at most its slots)
and the pinned ones (``pinned_keys``: the revisions with a pin or a warm policy) are read
whole at each report. The sets are the same as a walk of every copy gives
(``tests/sim/test_sim_reports.py`` compares them at every report).
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable, Sequence

from loraplex.artifacts.identity import AdapterKey
from loraplex.clock import ManualClock
from loraplex.residency.cache import ResidencyChanges
from loraplex.residency.ledger import CACHED_TIERS, Tier
from loraplex.router import ReplicaLoad, ReplicaReport, Residency, Router, RouteRequest
from loraplex.router.memory import Entry
from loraplex.router.router import router_config
from loraplex.router.topology import FleetTopology
from loraplex.sim.config import SimConfig
from loraplex.sim.replica import SimReplica

EVICTION_WINDOW_S = 60.0  # fleet.replica: evictions_per_min is over the last minute


class SimFleetRouter:
    """Routes each request with the real router; counts decisions by reason."""

    def __init__(self, config: SimConfig, clock: ManualClock, replicas: Sequence[SimReplica]):
        self._clock = clock
        self._interval_s = config.report_interval_s
        policy = config.routing_policy
        self.router = Router(
            policy,
            router_config(policy, config.router),  # ``SimConfig.router``: the fleet's table
            clock=clock,
            rng=random.Random(config.seed),
        )
        self._replicas = {r.replica_id: r for r in replicas}
        self._reports: dict[str, ReplicaReport | None] = dict.fromkeys(self._replicas)
        self._evictions: dict[str, deque[tuple[float, int]]] = {r: deque() for r in self._replicas}
        self.decisions: Counter[str] = Counter()  # reason -> requests
        self._names: dict[AdapterKey, str] = {}  # str(key), made once per key
        self._oldest_s: float | None = None  # the oldest report's time (None: none yet)
        self._ready = {r: _ReadySets() for r in self._replicas}  # per replica (module docstring)
        self._keys: dict[str, AdapterKey] = {}  # ``name``'s inverse
        # ``SimConfig.topology``: the real tracker on the virtual clock (None: no dedication)
        self.topology = (
            None if config.topology is None else FleetTopology(config.topology, clock, self._ask)
        )
        # request id -> its ``FleetTopology.record`` entry, until it ends (``ended``)
        self._counted: dict[str, tuple[float, str | None, int]] = {}
        # request id -> its decision's mark in the router's memory (``Router.last_mark``)
        self._marks: dict[str, tuple[str, Entry]] = {}
        for replica in replicas:
            replica.on_end = self.ended

    def route(self, request: RouteRequest, request_id: str) -> tuple[SimReplica, str]:
        """The replica ``request`` goes to and the router's reason (with a topology, the
        request is counted and the dedication decided first, as the Ray request router does)."""
        self._refresh()
        if self.topology is not None:
            self._counted[request_id] = self.topology.record(request)
            self.router.dedication = self.topology.update(self._reports)
        decision = self.router.choose(request, self._reports)
        if self.router.last_mark is not None:
            self._marks[request_id] = self.router.last_mark
        reason = decision.reason.value
        self.decisions[reason] += 1
        return self._replicas[decision.replica_id], reason

    def ended(self, request_id: str, admitted: bool) -> None:
        """A request ended, as the fleet's engine client reports it (``routing.UNADMITTED``):
        one never admitted (refused, aborted or expired before its first token) is withdrawn
        from the router's memory (``Router.withdraw``) and uncounted from the topology's window
        at once, the dedication following at the next decision; one admitted ends its decision
        (``Router.finish``: no longer its replica's load, still its revision's there).
        NOTE: neither was done before, so a replica's finished and refused requests stayed its
        pending load here until its next report, where the fleet's router drops them at their
        end (docs/benchmarks/attackfleet.md, attackfleet2.md)."""
        mark = self._marks.pop(request_id, None)
        if mark is not None:
            if admitted:
                self.router.finish(mark)
            else:
                self.router.withdraw(mark)
        entry = self._counted.pop(request_id, None)
        if entry is not None and not admitted and self.topology is not None:
            self.topology.withdraw(entry)

    def _refresh(self) -> None:
        now = self._clock.now()
        # NOTE: the oldest report is the first due (a later one's age is never larger).
        if self._oldest_s is not None and now - self._oldest_s < self._interval_s:
            return
        for replica_id, report in self._reports.items():
            if report is None or now - report.at_s >= self._interval_s:
                self._reports[replica_id] = self._report(self._replicas[replica_id], now)
        self._oldest_s = min(r.at_s for r in self._reports.values() if r is not None)

    def _report(self, replica: SimReplica, now_s: float) -> ReplicaReport:
        replica.settle()  # its skipped steps, up to now
        # The sets a snapshot's entries give (fleet.replica.routing_report); a snapshot also
        # sorts every copy and copies its history.
        cache, name = replica.cache, self.name
        ready = self._ready[replica.replica_id]
        ready.update(cache.residency_changes(ready.version), name)
        l0 = cache.ledgers[Tier.L0].entries
        residency = Residency(
            l0=ready.frozen[Tier.L0],
            l1=ready.frozen[Tier.L1],
            l2=ready.frozen[Tier.L2],
            loading=frozenset(name(key) for key, entry in l0.items() if not entry.ready),
            pinned=frozenset(name(key) for key in cache.pinned_keys()),
            merged=_merged(replica, name),
        )
        view = replica.scheduler.make_stats()
        evictions = replica.cache.num_evictions()
        load = ReplicaLoad(
            num_queued=view.num_waiting,
            num_adapter_wait=view.num_adapter_wait,
            num_running=view.num_running,
            num_active_tokens=view.num_active_tokens,
            kv_usage=min(1.0, max(0.0, view.kv_usage)),
            evictions_per_min=self._per_min(replica.replica_id, now_s, evictions),
        )
        return ReplicaReport(replica.replica_id, now_s, residency, load)

    def name(self, key: AdapterKey) -> str:
        """``str(key)``, made once per key (the router's name for it)."""
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = str(key)
            self._keys[name] = key
        return name

    def _ask(self, replica_id: str, adapter_key: str | None) -> None:
        """``FleetTopology``'s ask: the replica's ``auto`` mode is to merge ``adapter_key``."""
        key = None if adapter_key is None else self._keys[adapter_key]
        self._replicas[replica_id].dedicated = key

    def _per_min(self, replica_id: str, now_s: float, total: int) -> float:
        window = self._evictions[replica_id]
        window.append((now_s, total))
        while len(window) > 1 and now_s - window[0][0] > EVICTION_WINDOW_S:
            window.popleft()
        oldest_s, oldest = window[0]
        return max(0, total - oldest) * 60.0 / max(now_s - oldest_s, EVICTION_WINDOW_S)


def _merged(replica: SimReplica, name: Callable[[AdapterKey], str]) -> frozenset[str]:
    """What ``fleet.replica.routing_report`` reports merged: the revision its mode merged (here
    the dedicated one, once in its GPU slots: ``SimReplica.merged``), else none."""
    key = replica.merged()
    return frozenset() if key is None else frozenset((name(key),))


class _ReadySets:
    """One replica's ready copies by tier (names), kept from its cache's change log."""

    def __init__(self) -> None:
        self.version = 0  # the change log's version read last (0: none yet: the whole map)
        self._members: dict[Tier, set[str]] = {t: set() for t in CACHED_TIERS}
        self.frozen: dict[Tier, frozenset[str]] = dict.fromkeys(CACHED_TIERS, frozenset())

    def update(self, changes: ResidencyChanges, name: Callable[[AdapterKey], str]) -> None:
        """Applies ``changes``; a tier's frozen set is made again only where it changed."""
        members = self._members
        changed: set[Tier] = set()
        if changes.full:
            for tier, names in members.items():
                if names:
                    names.clear()
                    changed.add(tier)
        for key, tiers in changes.tiers.items():
            item = name(key)
            for tier, names in members.items():
                if tier in tiers:
                    if item not in names:
                        names.add(item)
                        changed.add(tier)
                elif item in names:
                    names.remove(item)
                    changed.add(tier)
        for tier in changed:
            self.frozen[tier] = frozenset(members[tier])
        self.version = changes.version
