"""The tracer's per-tenant shares of the span export queue (``tracing/share.py``), counted with
tenant-free labels. Present only while tracing is on; the label takes the values of
``PriorityClass``, each from 0.

- ``loraplex_trace_parent_refused_total{priority_class}``: requests whose caller's sampled W3C
  ``traceparent`` was not honoured because its tenant had used its share for flags (or its
  share of all kinds); they were sampled as if they carried no flag.
- ``loraplex_trace_errors_dropped_total{priority_class}``: failed requests whose trace was
  dropped because its tenant had used its share for errors (or of all kinds), and neither its
  duration, a flag nor the ratio kept it. Every failure is still counted in the response metrics.
- ``loraplex_trace_slow_dropped_total{priority_class}``: requests slower than ``trace_slow_s``
  whose trace was dropped because its tenant had used its share for slow requests (or of all
  kinds), and no other rule kept it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from loraplex.registry.models import PriorityClass
from loraplex.tracing.record import RequestTracing


class TraceCollector(Collector):
    """The tracer's refusals and dropped error and slow traces at scrape time."""

    def __init__(self, tracing: RequestTracing) -> None:
        self._tracing = tracing

    def collect(self) -> Iterator[Metric]:
        yield _by_class(
            "loraplex_trace_parent_refused",
            "Requests whose sampled traceparent was not honoured (their tenant past its share "
            "of the span export queue), by the tenant's priority class.",
            self._tracing.parent_refused(),
        )
        yield _by_class(
            "loraplex_trace_errors_dropped",
            "Failed requests whose trace was dropped (their tenant past its share of the span "
            "export queue for errors), by the tenant's priority class.",
            self._tracing.errors_dropped(),
        )
        yield _by_class(
            "loraplex_trace_slow_dropped",
            "Slow requests whose trace was dropped (their tenant past its share of the span "
            "export queue for slow requests), by the tenant's priority class.",
            self._tracing.slow_dropped(),
        )


def _by_class(name: str, documentation: str, counts: Mapping[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=("priority_class",))
    for priority_class in PriorityClass:
        family.add_metric((priority_class.value,), counts.get(priority_class.value, 0))
    return family
