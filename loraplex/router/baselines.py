"""The baselines loraplex's policy must beat, emulated over the same reports.

``pow2``: Ray Serve's default router, power of two choices on queue length. It knows nothing of
adapters.

``ray_multiplex``: Ray Serve's model multiplexing, which Ray Serve LLM uses for LoRA (the
adapter is the multiplexed model id). Per its documentation: replicas that report the model id
loaded are tried first (power of two choices among them); when none has it, or all that have it
are full, the replicas with the fewest models loaded are tried, then all replicas. "Loaded"
here is L0 or L1 (an adapter the engine has added, in GPU slots or its CPU cache); "full" is
saturated. Like Ray, it does not remember its own decisions as residency (only as load).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from loraplex.router.config import RouterConfig
from loraplex.router.decision import Decision, Reason, RouteRequest, decision, no_report, pow2
from loraplex.router.reports import ReplicaReport
from loraplex.router.view import ReplicaView, is_saturated


class Pow2Policy:
    """Ray Serve's default: two random replicas, fewer ongoing requests wins."""

    name = "pow2"
    reads: frozenset[str] = frozenset()  # RouterConfig fields it reads (none: ongoing counts)
    follows_dedication = False  # a replica dedicated to a revision is one more replica to it

    def __init__(self, config: RouterConfig, rng: random.Random) -> None:
        self._rng = rng

    def rank(self, request: RouteRequest, fleet: Sequence[ReplicaView], now_s: float) -> Decision:
        return decision(pow2(fleet, self._rng), fleet, Reason.POW2)


def _loaded(report: ReplicaReport, adapter_key: str) -> bool:
    return adapter_key in report.residency.l0 or adapter_key in report.residency.l1


def _num_loaded(report: ReplicaReport) -> int:
    l0, l1 = report.residency.l0, report.residency.l1
    if isinstance(l0, frozenset) and isinstance(l1, frozenset):
        return len(l0 | l1)
    return len(l0) + len(l1)  # a Bloom filter cannot be intersected: an upper bound


class RayMultiplexPolicy:
    """Ray Serve's multiplexed-model-id routing (see the module docstring)."""

    name = "ray_multiplex"
    reads = frozenset({"max_queued", "max_ongoing", "max_kv_usage"})  # saturation alone
    follows_dedication = False

    def __init__(self, config: RouterConfig, rng: random.Random) -> None:
        self._config = config
        self._rng = rng

    def rank(self, request: RouteRequest, fleet: Sequence[ReplicaView], now_s: float) -> Decision:
        key = request.adapter_key
        if key is None:
            return decision(pow2(fleet, self._rng), fleet, Reason.POW2)
        known = [v for v in fleet if v.report is not None]
        if not known:
            return no_report(fleet, self._rng)
        open_ = [v for v in known if not is_saturated(v, self._config)]
        holders = [v for v in open_ if v.report is not None and _loaded(v.report, key)]
        if holders:
            return decision(pow2(holders, self._rng), fleet, Reason.MULTIPLEX)
        if not open_:
            return decision(pow2(fleet, self._rng), fleet, Reason.POW2)
        counts = {v.replica_id: _num_loaded(v.report) for v in open_ if v.report is not None}
        fewest = min(counts.values())
        emptiest = [v for v in open_ if counts[v.replica_id] == fewest]
        return decision(pow2(emptiest, self._rng), fleet, Reason.POW2)
