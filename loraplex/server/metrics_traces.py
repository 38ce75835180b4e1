"""``loraplex_trace_parent_refused_total{priority_class}``: requests whose caller's sampled W3C
``traceparent`` was not honoured because its tenant had used its share of the span export queue
(``tracing/share.py``); they were sampled as if they carried no flag. Present only while tracing
is on; the label takes the values of ``PriorityClass``, each from 0."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from loraplex.registry.models import PriorityClass
from loraplex.tracing.record import RequestTracing


class TraceCollector(Collector):
    """The tracer's refusals at scrape time."""

    def __init__(self, tracing: RequestTracing) -> None:
        self._tracing = tracing

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "loraplex_trace_parent_refused",
            "Requests whose sampled traceparent was not honoured (their tenant past its share "
            "of the span export queue), by the tenant's priority class.",
            labels=("priority_class",),
        )
        refused = self._tracing.parent_refused()
        for priority_class in PriorityClass:
            family.add_metric((priority_class.value,), refused.get(priority_class.value, 0))
        yield family
