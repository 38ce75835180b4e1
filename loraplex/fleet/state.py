"""What the fleet's ingress shows of its replicas: ``FleetStateView`` (``/admin/fleet``, the
dashboard, ``fleet status``) and ``FleetCollector`` (the per-replica and routing families of the
ingress's /metrics). Both read the board as the link last polled it and this process's
``ROUTING_LOG``; replica labels are bounded by the board's ``MAX_REPLICAS``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from loraplex.fleet.board import BoardEntry
from loraplex.fleet.link import FleetLink
from loraplex.fleet.routing import ROUTING_LOG, rank_of
from loraplex.router.fleet_state import (
    CACHED_TIER_NAMES,
    FleetState,
    ReplicaLoadView,
    ReplicaState,
    TierOccupancy,
)
from loraplex.router.placement import rank_name


def replica_state(entry: BoardEntry) -> ReplicaState:
    status = entry.status
    load = status["report"]["load"]
    return ReplicaState(
        replica_id=entry.replica_id,
        healthy=entry.healthy,
        report_age_s=entry.age_s,
        tiers={name: TierOccupancy(**status["tiers"][name]) for name in CACHED_TIER_NAMES},
        hits=dict(status["hits"]),
        load=ReplicaLoadView(
            num_queued=load["num_queued"] + load["num_adapter_wait"],
            num_running=load["num_running"],
            num_active_tokens=load["num_active_tokens"],
            kv_usage=load["kv_usage"],
            evictions_per_min=load["evictions_per_min"],
        ),
        down_reason=entry.down_reason,
        placement=None if (rank := rank_of(status)) is None else rank_name(rank),
    )


class FleetStateView:
    """``FleetStateSource`` of the fleet's ingress."""

    def __init__(self, link: FleetLink) -> None:
        self._link = link

    def fleet_state(self) -> FleetState:
        return FleetState(
            at_s=time.time(),
            policy=ROUTING_LOG.policy,
            replicas=tuple(replica_state(e) for e in self._link.entries()),
            decisions=ROUTING_LOG.counts(),
        )


class FleetCollector(Collector):
    """Per-replica occupancy, health and load, and routing decisions by reason."""

    def __init__(self, link: FleetLink, retries: Callable[[], int]) -> None:
        self._link = link
        self._retries = retries

    def collect(self) -> Iterator[Metric]:
        entries = self._link.entries()
        healthy = GaugeMetricFamily(
            "loraplex_fleet_replica_healthy",
            "1 while the replica is in rotation",
            labels=["replica"],
        )
        copies = GaugeMetricFamily(
            "loraplex_fleet_replica_resident_adapters",
            "Adapter copies per replica and tier",
            labels=["replica", "tier"],
        )
        used = GaugeMetricFamily(
            "loraplex_fleet_replica_resident_bytes",
            "Adapter bytes per replica and tier",
            labels=["replica", "tier"],
        )
        queued = GaugeMetricFamily(
            "loraplex_fleet_replica_queued_requests",
            "Queued requests per replica",
            labels=["replica"],
        )
        running = GaugeMetricFamily(
            "loraplex_fleet_replica_running_requests",
            "Running requests per replica",
            labels=["replica"],
        )
        for entry in entries:
            state = replica_state(entry)
            rid = state.replica_id
            healthy.add_metric([rid], 1.0 if state.healthy else 0.0)
            for name, tier in state.tiers.items():
                copies.add_metric([rid, name.upper()], tier.count)
                used.add_metric([rid, name.upper()], tier.used_bytes)
            if state.load is not None:
                queued.add_metric([rid], state.load.num_queued)
                running.add_metric([rid], state.load.num_running)
        decisions = CounterMetricFamily(
            "loraplex_fleet_routing_decisions",
            "Requests routed, by why the replica was chosen",
            labels=["reason"],
        )
        for reason, count in sorted(ROUTING_LOG.counts().items()):
            decisions.add_metric([reason], count)
        retries = CounterMetricFamily(
            "loraplex_fleet_request_retries",
            "Requests sent again after their replica was lost before the first token",
        )
        retries.add_metric([], self._retries())
        departed = CounterMetricFamily(
            "loraplex_fleet_replicas_departed", "Replicas that left the board"
        )
        departed.add_metric([], self._link.num_departed)
        malformed = CounterMetricFamily(
            "loraplex_fleet_malformed_reports",
            "Replica routing reports the router refused (the replica kept its previous report)",
        )
        malformed.add_metric([], ROUTING_LOG.malformed_reports)
        yield from (healthy, copies, used, queued, running, decisions, retries, departed, malformed)
