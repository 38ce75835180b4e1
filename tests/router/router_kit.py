"""Constructed reports and a router on a manual clock, for the router tests."""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from loraplex.clock import ManualClock
from loraplex.router import (
    ReplicaLoad,
    ReplicaReport,
    Residency,
    Router,
    RouterConfig,
    RouteRequest,
)


def report(
    replica_id: str,
    *,
    at_s: float = 0.0,
    l0: Iterable[str] = (),
    l1: Iterable[str] = (),
    l2: Iterable[str] = (),
    loading: Iterable[str] = (),
    pinned: Iterable[str] = (),
    queued: int = 0,
    running: int = 0,
    tokens: int = 0,
    kv: float = 0.0,
    evictions: float = 0.0,
    adapter_wait: int = 0,
    merged: Iterable[str] = (),
) -> ReplicaReport:
    residency = Residency(
        frozenset(l0),
        frozenset(l1),
        frozenset(l2),
        frozenset(loading),
        frozenset(pinned),
        frozenset(merged),
    )
    load = ReplicaLoad(queued, running, tokens, kv, evictions, adapter_wait)
    return ReplicaReport(replica_id, at_s, residency, load)


def make_router(
    policy: str = "affinity_until_saturated", seed: int = 0, **config: object
) -> tuple[Router, ManualClock]:
    clock = ManualClock()
    cfg = RouterConfig(**config)  # type: ignore[arg-type]
    return Router(policy, cfg, clock=clock, rng=random.Random(seed)), clock


def req(
    adapter: str | None = "t/a@1",
    session: str | None = None,
    tokens: int = 16,
    tenant: str | None = None,
) -> RouteRequest:
    return RouteRequest(adapter, session, tokens, tenant=tenant)


def idle(*replica_ids: str, at_s: float = 0.0) -> dict[str, ReplicaReport | None]:
    return {r: report(r, at_s=at_s) for r in replica_ids}


@dataclass
class ToyReplica:
    """One engine replica reduced to an LRU of GPU slots and a backlog of work units, for the
    seeded fleet simulations: a hit costs one unit, a miss (its load) ``miss_cost``, and every
    tick finishes ``capacity_per_tick`` units and reports the backlog as the queue."""

    replica_id: str
    num_slots: int
    capacity_per_tick: float
    miss_cost: float
    slots: OrderedDict[str, None] = field(default_factory=OrderedDict)
    backlog: float = 0.0
    evictions: int = 0  # since the last report

    def serve(self, key: str) -> bool:
        hit = key in self.slots
        if hit:
            self.slots.move_to_end(key)
        else:
            self.slots[key] = None
            if len(self.slots) > self.num_slots:
                self.slots.popitem(last=False)
                self.evictions += 1
        self.backlog += 1.0 if hit else self.miss_cost
        return hit

    def tick(self, now_s: float, *, report_evictions: bool = True) -> ReplicaReport:
        """The report at ``now_s`` (evictions as a per-minute rate of the last 1 s tick)."""
        self.backlog = max(0.0, self.backlog - self.capacity_per_tick)
        rate = self.evictions * 60.0 if report_evictions else 0.0
        self.evictions = 0
        return report(
            self.replica_id, at_s=now_s, l0=self.slots, queued=int(self.backlog), evictions=rate
        )
