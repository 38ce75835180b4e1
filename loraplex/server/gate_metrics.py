"""The connection gate's counts at scrape time (``/metrics``; ``connections.py``)."""

from __future__ import annotations

from collections.abc import Iterator, Sized

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from loraplex.server.connections import ConnectionGate


class GateCollector(Collector):
    """The gate's counts at scrape time (``/metrics``)."""

    def __init__(self, gate: ConnectionGate, tarpit: Sized | None = None) -> None:
        self._gate = gate
        self._tarpit = tarpit  # ``tarpit.Tarpit``: connections held off (not admitted)

    def collect(self) -> Iterator[Metric]:
        gate = self._gate
        open_by_state = GaugeMetricFamily(
            "loraplex_connections", "Open client connections by state.", labels=("state",)
        )
        num_unauthenticated = gate.num_unauthenticated
        open_by_state.add_metric(("authenticated",), gate.num_open - num_unauthenticated)
        open_by_state.add_metric(("unauthenticated",), num_unauthenticated)
        open_by_state.add_metric(("waiting",), gate.num_waiting)
        if self._tarpit is not None:
            open_by_state.add_metric(("held",), len(self._tarpit))
        yield open_by_state
        yield CounterMetricFamily(
            "loraplex_connections_refused",
            "Connections closed as soon as they were accepted (a cap or the accept rate), or "
            "refused at their first request (their tenant at max_tenant_connection_share).",
            value=gate.num_refused,
        )
        yield CounterMetricFamily(
            "loraplex_connections_evicted",
            "Connections closed to make room for a new one (idle unauthenticated ones, or at "
            "max_connections the largest tenant's idle one or its slowest request body, one "
            "refused at max_tenant_connection_share, or an unauthenticated one from the address "
            "of such a refusal).",
            value=gate.num_evicted,
        )
        yield CounterMetricFamily(
            "loraplex_connections_drained",
            "Tenant connections told to close after their answer (Connection: close) at "
            "max_connections, when the largest tenant had no quiet connection to close (down "
            "to its max_tenant_connection_share).",
            value=gate.num_drained,
        )
