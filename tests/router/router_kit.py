"""Constructed reports and a router on a manual clock, for the router tests."""

from __future__ import annotations

import random
from collections.abc import Iterable

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
    adapter: str | None = "t/a@1", session: str | None = None, tokens: int = 16
) -> RouteRequest:
    return RouteRequest(adapter, session, tokens)


def idle(*replica_ids: str, at_s: float = 0.0) -> dict[str, ReplicaReport | None]:
    return {r: report(r, at_s=at_s) for r in replica_ids}
