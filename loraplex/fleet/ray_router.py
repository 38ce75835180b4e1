"""``LoraplexRequestRouter``: the router policy (``loraplex/router/``) plugged into Ray Serve.

Ray Serve calls ``choose_replicas`` in the process that holds the engine deployment's handle
(the ingress, or a benchmark driver) for every call through the handle. Each engine replica's
``record_routing_stats()`` hands Ray its encoded ``ReplicaReport`` (every
``request_routing_stats_period_s``); this router decodes it, stamps it on its own clock with
when it was made (``routing.ReportStamps``: replica clocks are not comparable, so the replica's
``at_s`` plus the smallest offset seen from it), and asks ``Router.choose`` for the ranking,
naming each replica by its deployment rank (``routing.PlacementNames``: ``rank-0``, .. where its
stats carry one), not by Ray's random id: a revision's placement is a hash of these names.
A malformed report counts as none (that replica keeps its previous report, if fresh). A
replica whose stats say its engine is not up (down, or hung: ``engine/watchdog.py``), or whose
latest report is older than ``stale_after_s`` (its whole process frozen or unreachable: Ray
keeps the last stats it had), is out of the rotation until a fresh report says it is up again,
unless every replica is out.

With ``topology`` set, every ``generate`` call is counted by ``FleetTopology`` (and uncounted
if it ends before its first token: ``routing.UNADMITTED``) and the router
steers the dedicated revision to its replica (docs/modes.md, "Topology"); the asks go through
``routing.TOPOLOGY_ASKS``, which the ingress connects to its link.

A call carrying ``RouteHint(target=...)`` (a cache call or a probe that must reach one
particular replica) goes to that replica only; ``RouteHint(avoid=...)`` leaves replicas out (a
retry after a replica died), unless that would leave none.

Every replica Ray Serve drops from this router (``update_replicas``, ``on_replica_actor_died``)
is marked in ``left_replicas.LEFT_REPLICAS``, so the ingress's view of the board leaves it out at
once rather than when its reports go stale.

Every decision is counted by reason in ``routing.ROUTING_LOG`` (this process's), which the
ingress's /metrics and ``/admin/fleet`` read. NOTE: Ray pickles this module by value into every
process holding the handle: it defines nothing but the class, so everything the class uses is
reached through its module (modules pickle by reference: one ``ROUTING_LOG`` per process).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Mapping
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from loraplex.clock import Clock, MonotonicClock
from loraplex.engine.protocol import EngineRequest
from loraplex.fleet import left_replicas, routing
from loraplex.fleet import settings as fleet_settings
from loraplex.fleet.wire import RouteHint
from loraplex.router.config import RouterConfig
from loraplex.router.memory import Entry
from loraplex.router.router import DEFAULT_POLICY, Router
from loraplex.router.topology import FleetTopology, TopologyConfig


class LoraplexRequestRouter(RequestRouter):  # type: ignore[misc]
    """Ray Serve's request router running loraplex's policy (see the module docstring)."""

    def initialize_state(
        self,
        policy: str = DEFAULT_POLICY,
        router_config: Mapping[str, Any] | None = None,
        seed: int | None = None,
        stale_after_s: float | None = None,
        *,
        topology: Mapping[str, Any] | None = None,
        clock: Clock | None = None,
        **unknown: Any,
    ) -> None:
        """``stale_after_s``: the fleet's bound (None: the default period's); ``topology``:
        ``TopologyConfig`` fields (None: no dedication); ``clock``: the router's clock (tests
        inject one; Ray passes none: monotonic)."""
        if unknown:
            raise ValueError(f"request_router_kwargs {sorted(unknown)} are unknown")
        clock = clock or MonotonicClock()
        config = RouterConfig(**dict(router_config or {}))
        self._clock = clock
        if stale_after_s is None:
            periods = fleet_settings.STALE_REPORT_PERIODS
            stale_after_s = periods * fleet_settings.DEFAULT_REPORT_PERIOD_S
        self._stale_after_s = stale_after_s
        self._router = Router(policy, config, clock=clock, rng=random.Random(seed))
        self._topology = (
            None
            if topology is None
            else FleetTopology(TopologyConfig(**topology), clock, self._ask)
        )
        self._stamps = routing.ReportStamps()
        self._names = routing.PlacementNames()
        self._first_tries = routing.FirstTries()
        self._lock = threading.Lock()
        routing.ROUTING_LOG.policy = policy

    def _ask(self, name: str, adapter_key: str | None) -> None:
        """``FleetTopology``'s ask, made by placement name, sent to that replica's Ray id.
        Called under ``_lock``."""
        routing.TOPOLOGY_ASKS.ask(self._names.id_of(name), adapter_key)

    def _unadmitted(
        self,
        work: EngineRequest,
        pending: PendingRequest | None,
        entry: tuple[float, str | None, int] | None,
        mark: tuple[str, Entry] | None,
    ) -> None:
        """Until a generate call's first token (``routing.UNADMITTED``): if it is refused,
        cancelled or lost before it, its decision is withdrawn from the router's memory (where
        it was sent last: ``mark``, or its latest backoff ask's) and uncounted from the topology
        (``entry``: ``FleetTopology.record``'s, None without one); if it ends after its first
        token, its decision ends there (``Router.finish``: no longer load, its revision still
        named until the replica's next report). Called under ``_lock``.

        NOTE: a call ended at once stayed the replica's pending load until its next report: a
        tenant sending requests and cancelling them made that replica look saturated (8 in a
        report period, at the default ``max_queued``), and other tenants' requests for the
        revisions it holds went elsewhere, to load them cold (docs/benchmarks/attackfleet.md).
        So did a call answered in full before that report: two clients sending 1-token
        completions back to back saturated every replica in the router's eyes
        (docs/benchmarks/attackfleet2.md)."""
        topology = self._topology

        def latest() -> tuple[str, Entry] | None:
            return self._first_tries.mark(pending) if routing.has_call_id(pending) else mark

        def undo_locked() -> None:
            if topology is not None and entry is not None:
                topology.withdraw(entry)
            withdrawn = latest()
            if withdrawn is not None:
                self._router.withdraw(withdrawn)
            self._first_tries.end(pending)  # a late backoff ask marks nothing again

        def undo() -> None:
            with self._lock:
                undo_locked()

        def finish() -> None:
            with self._lock:
                ended = latest()
                if ended is not None:
                    self._router.finish(ended)

        if not routing.UNADMITTED.counted(work.tenant, work.request_id, undo, finish):
            undo_locked()  # the request ended (its client left) before this ask ran

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        """Ray's update, and every replica it removed marked left (``left_replicas``)."""
        before = [i.unique_id for i in self.curr_replicas]
        super().update_replicas(replicas)
        after = [r.replica_id.unique_id for r in replicas]
        left_replicas.LEFT_REPLICAS.mark_dropped(before, after)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        """Ray's drop of a replica a call found dead, marked left (``left_replicas``)."""
        super().on_replica_actor_died(replica_id)
        left_replicas.LEFT_REPLICAS.mark(replica_id.unique_id, "a call to it found it dead")

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        if not by_id:
            return []
        hint = pending_request.kwargs.get("hint") if pending_request is not None else None
        if isinstance(hint, RouteHint) and hint.target is not None:
            if hint.target in by_id:
                return [[by_id[hint.target]]]
            # NOTE: the replica left: any replica takes the call and refuses it at once
            # (``deployments``), rather than Ray retrying a choice that can never be made.
            return [list(by_id.values())]
        avoid = hint.avoid if isinstance(hint, RouteHint) else frozenset()
        args = pending_request.args if pending_request is not None else []
        request = routing.route_request_of(args)
        is_work = bool(args) and isinstance(args[0], EngineRequest)
        with self._lock:  # NOTE: several routing tasks may run; the router's memory is shared
            now_s = self._clock.now()
            self._stamps.forget_except(set(by_id))
            reports = {
                i: self._stamps.report_of(i, r.routing_stats or {}, now_s) for i, r in by_id.items()
            }
            # an engine down or hung, or a replica whose reports stopped, leaves the rotation
            offered = routing.in_rotation(by_id, reports, now_s, self._stale_after_s)
            if avoid:  # a retry: the replica it was lost on is left out, unless none remains
                offered = routing.without(offered, avoid) or routing.without(by_id, avoid) or by_id
            # the policy knows replicas by placement name (their rank), Ray by their ids
            named = self._names.rename(
                {i: r.routing_stats or {} for i, r in offered.items()},
                {i: reports[i] for i in offered},
            )
            # a call Ray asks about again (no replica took it) is counted once, and is
            # pending only where it was sent last
            first_call = self._first_tries.first(pending_request)
            first_try = is_work and first_call
            entry: tuple[float, str | None, int] | None = None
            if self._topology is not None and is_work:
                if first_try:
                    entry = self._topology.record(request)
                self._router.dedication = self._topology.update(named)
            replaces = None if first_call else self._first_tries.mark(pending_request)
            decision = self._router.choose(request, named, replaces=replaces)
            mark = self._router.last_mark
            if mark is not None and self._first_tries.ended(pending_request):
                # NOTE: Ray asks once more after its backoff sleep before it sees the call
                # cancelled; ranked, but not pending anywhere (its undo ran already)
                self._router.withdraw(mark)
            self._first_tries.remember(pending_request, mark)
            if first_try:
                self._unadmitted(args[0], pending_request, entry, self._router.last_mark)
            ranked = [offered[self._names.ids[name]] for name in decision.ranked]
        if first_try:
            routing.ROUTING_LOG.record(decision.reason.value)
        return [[replica] for replica in ranked]
