"""The tracer's per-tenant shares of the span export queue (``tracing/share.py``) and what became
of the spans it kept (``tracing/delivery.py``), counted with tenant-free labels. Present only
while tracing is on; each label takes every value of its fixed set from 0 (``PriorityClass``,
``DROP_REASONS``).

- ``loraplex_trace_parent_refused_total{priority_class}``: requests whose caller's sampled W3C
  ``traceparent`` was not honoured because its tenant had used its share for flags (or its
  share of all kinds); they were sampled as if they carried no flag.
- ``loraplex_trace_errors_dropped_total{priority_class}``: failed requests whose trace was
  dropped because its tenant had used its share for errors (or of all kinds), and neither its
  duration, a flag nor the ratio kept it. Every failure is still counted in the response metrics.
- ``loraplex_trace_slow_dropped_total{priority_class}``: requests slower than ``trace_slow_s``
  whose trace was dropped because its tenant had used its share for slow requests (or of all
  kinds), and no other rule kept it.
- ``loraplex_trace_spans_exported_total``: spans the OTLP receiver accepted.
- ``loraplex_trace_spans_dropped_total{reason}``: spans of kept traces that never reached it:
  ``queue_full`` (the export queue was full), ``export_failed`` (the receiver down, slow past
  the export timeout, or refusing), ``shutdown`` (still queued when the server stopped).
- ``loraplex_trace_build_failed_total``: kept traces whose spans could not be built (a bug of
  ours, logged with its traceback): lost before any span was made, so counted per trace, not
  among the dropped spans."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from loraplex.registry.models import PriorityClass
from loraplex.tracing.record import DROP_REASONS, RequestTracing


class TraceCollector(Collector):
    """The tracer's refusals, dropped error and slow traces, lost spans and unbuilt traces at
    scrape time."""

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
        exported = CounterMetricFamily(
            "loraplex_trace_spans_exported",
            "Spans of kept traces the OTLP receiver accepted.",
        )
        exported.add_metric((), self._tracing.spans_exported())
        yield exported
        yield _counts(
            "loraplex_trace_spans_dropped",
            "Spans of kept traces that never reached the OTLP receiver, by reason (queue_full, "
            "export_failed, shutdown).",
            ("reason", DROP_REASONS),
            self._tracing.spans_dropped(),
        )
        build_failed = CounterMetricFamily(
            "loraplex_trace_build_failed",
            "Kept traces whose spans could not be built (logged); lost before any span was made.",
        )
        build_failed.add_metric((), self._tracing.traces_build_failed())
        yield build_failed


def _by_class(name: str, documentation: str, counts: Mapping[str, int]) -> CounterMetricFamily:
    classes = tuple(priority_class.value for priority_class in PriorityClass)
    return _counts(name, documentation, ("priority_class", classes), counts)


def _counts(
    name: str, documentation: str, label: tuple[str, tuple[str, ...]], counts: Mapping[str, int]
) -> CounterMetricFamily:
    """``counts`` under one label (name, every value), each value from 0."""
    label_name, values = label
    family = CounterMetricFamily(name, documentation, labels=(label_name,))
    for value in values:
        family.add_metric((value,), counts.get(value, 0))
    return family
