"""The fleet's router in the simulator: the real ``router.Router`` choosing among simulated
replicas from their reports, as the Ray Serve request router does.

A replica's report (residency per tier from its cache's snapshot, load from its scheduler's
counts, evictions over the last minute) is built the way ``fleet.replica.routing_report``
builds it, and renewed at the first decision after ``report_interval_s`` has passed, so the
router decides on state up to one interval old and on its own decisions since, as it does live.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Sequence

from loraplex.artifacts.identity import AdapterKey
from loraplex.clock import ManualClock
from loraplex.residency.ledger import Tier
from loraplex.router import ReplicaLoad, ReplicaReport, Residency, Router, RouteRequest
from loraplex.sim.config import SimConfig
from loraplex.sim.replica import SimReplica

EVICTION_WINDOW_S = 60.0  # fleet.replica: evictions_per_min is over the last minute


class SimFleetRouter:
    """Routes each request with the real router; counts decisions by reason."""

    def __init__(self, config: SimConfig, clock: ManualClock, replicas: Sequence[SimReplica]):
        self._clock = clock
        self._interval_s = config.report_interval_s
        self.router = Router(config.routing_policy, clock=clock, rng=random.Random(config.seed))
        self._replicas = {r.replica_id: r for r in replicas}
        self._reports: dict[str, ReplicaReport | None] = dict.fromkeys(self._replicas)
        self._evictions: dict[str, deque[tuple[float, int]]] = {r: deque() for r in self._replicas}
        self.decisions: Counter[str] = Counter()  # reason -> requests
        self._names: dict[AdapterKey, str] = {}  # str(key), made once per key
        self._oldest_s: float | None = None  # the oldest report's time (None: none yet)

    def route(self, request: RouteRequest) -> tuple[SimReplica, str]:
        """The replica ``request`` goes to and the router's reason."""
        self._refresh()
        decision = self.router.choose(request, self._reports)
        reason = decision.reason.value
        self.decisions[reason] += 1
        return self._replicas[decision.replica_id], reason

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
        # The sets a snapshot's entries give (fleet.replica.routing_report), read from the
        # cache's ledgers directly: a snapshot also sorts every copy and copies its history.
        names = self._names
        tiers: dict[Tier, set[str]] = {Tier.L0: set(), Tier.L1: set(), Tier.L2: set()}
        loading: set[str] = set()
        pinned: set[str] = set()
        for tier, ledger in replica.cache.ledgers.items():
            for key, entry in ledger.entries.items():
                name = names.get(key)
                if name is None:
                    name = names[key] = str(key)
                if entry.ready:
                    tiers[tier].add(name)
                elif tier is Tier.L0:
                    loading.add(name)
                if entry.pinned:
                    pinned.add(name)
        residency = Residency(
            l0=frozenset(tiers[Tier.L0]),
            l1=frozenset(tiers[Tier.L1]),
            l2=frozenset(tiers[Tier.L2]),
            loading=frozenset(loading),
            pinned=frozenset(pinned),
        )
        view = replica.scheduler.make_stats()
        evictions = sum(replica.cache.summary().stats.evictions.values())
        load = ReplicaLoad(
            num_queued=view.num_waiting,
            num_adapter_wait=view.num_adapter_wait,
            num_running=view.num_running,
            num_active_tokens=view.num_active_tokens,
            kv_usage=min(1.0, max(0.0, view.kv_usage)),
            evictions_per_min=self._per_min(replica.replica_id, now_s, evictions),
        )
        return ReplicaReport(replica.replica_id, now_s, residency, load)

    def _per_min(self, replica_id: str, now_s: float, total: int) -> float:
        window = self._evictions[replica_id]
        window.append((now_s, total))
        while len(window) > 1 and now_s - window[0][0] > EVICTION_WINDOW_S:
            window.popleft()
        oldest_s, oldest = window[0]
        return max(0, total - oldest) * 60.0 / max(now_s - oldest_s, EVICTION_WINDOW_S)
