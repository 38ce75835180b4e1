"""``SpanDelivery``: the tracer's span processor, the SDK's ``BatchSpanProcessor`` (a bounded
queue exported on its own thread) with every span that does not reach the receiver counted.

The SDK loses spans with a log line at most: past its queue it drops one (silently on the
metrics side), after shutdown it ignores new ones, and a failed export (a receiver that is down,
slow past ``export_timeout_s`` or refusing) is logged and gone. Here each span handed over ends
in exactly one count, by reason (``record.DROP_REASONS``), or as exported:

- ``queue_full``: spans handed and not yet given to the exporter are counted; past
  ``max_queue_spans`` a new span is refused. A span leaves that count only once the SDK popped it
  from its queue of the same size, so the SDK's queue never overflows (the new span is dropped,
  never an older one);
- ``export_failed``: the exporter is wrapped; a batch it reports failed, or that raised;
- ``shutdown``: a span handed after shutdown, and what was still waiting once the SDK's shutdown
  returned (its final export gave up at its timeout); never sent afterwards.

Invariant (once nothing is in an export): spans handed = exported + sum of the drop counts.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Mapping, Sequence

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from loraplex.tracing.record import DROP_REASONS

_log = logging.getLogger(__name__)
MAX_EXPORT_BATCH_SPANS = 512  # the SDK's default batch; smaller queues take their own size


class SpanLedger:
    """What became of each span handed to the processor (thread-safe: the event loop hands
    spans, the SDK's worker thread exports them)."""

    def __init__(self, max_waiting: int) -> None:
        self._max_waiting = max_waiting
        self._lock = threading.Lock()
        self._waiting = 0  # handed and not yet given to the exporter (the SDK's queue, or more)
        self._closed = False  # shut down: waiting spans were counted lost
        self._exported = 0
        self._dropped: Counter[str] = Counter()

    def admit(self) -> bool:
        """Whether one more span may enter the queue (else it is counted lost)."""
        with self._lock:
            if self._closed:
                self._dropped["shutdown"] += 1
                return False
            if self._waiting >= self._max_waiting:
                self._dropped["queue_full"] += 1
                return False
            self._waiting += 1
            return True

    def take(self, num_spans: int) -> bool:
        """The exporter got ``num_spans`` from the queue; False: they were counted lost at
        shutdown already and must not be sent."""
        with self._lock:
            if self._closed:
                return False
            self._waiting -= num_spans
            return True

    def settle(self, num_spans: int, delivered: bool) -> None:
        with self._lock:
            if delivered:
                self._exported += num_spans
            else:
                self._dropped["export_failed"] += num_spans

    def close(self) -> int:
        """The processor shut down: what still waits is lost (returned)."""
        with self._lock:
            self._closed, lost = True, self._waiting
            self._dropped["shutdown"] += lost
            self._waiting = 0
            return lost

    def exported(self) -> int:
        with self._lock:
            return self._exported

    def dropped(self) -> Mapping[str, int]:
        with self._lock:
            return {reason: self._dropped[reason] for reason in DROP_REASONS}


class _CountedExporter(SpanExporter):
    """The real exporter, each batch's outcome settled in the ledger."""

    def __init__(self, inner: SpanExporter, ledger: SpanLedger) -> None:
        self._inner = inner
        self._ledger = ledger

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not self._ledger.take(len(spans)):
            return SpanExportResult.FAILURE
        try:
            result = self._inner.export(spans)
        except Exception:  # the SDK logs it; the spans are lost all the same
            self._ledger.settle(len(spans), delivered=False)
            raise
        self._ledger.settle(len(spans), delivered=result is SpanExportResult.SUCCESS)
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class SpanDelivery(SpanProcessor):
    """A ``BatchSpanProcessor`` of ``max_queue_spans`` whose losses are counted (module doc).

    NOTE: the SDK also skips a span whose context is not sampled, before its queue; every span
    the tracer builds is sampled (``spans.py``), so none is skipped there."""

    def __init__(
        self,
        exporter: SpanExporter,
        max_queue_spans: int,
        *,
        schedule_delay_ms: float | None = None,
    ) -> None:
        self._ledger = SpanLedger(max_queue_spans)
        self._batch = BatchSpanProcessor(
            _CountedExporter(exporter, self._ledger),
            max_queue_size=max_queue_spans,
            schedule_delay_millis=schedule_delay_ms,
            max_export_batch_size=min(MAX_EXPORT_BATCH_SPANS, max_queue_spans),
        )

    def on_end(self, span: ReadableSpan) -> None:
        if self._ledger.admit():
            self._batch.on_end(span)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._batch.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self._batch.shutdown()  # type: ignore[no-untyped-call]
        # NOTE: a stopping server is seldom scraped again: the log line says it too.
        lost = self._ledger.close()
        if lost:
            _log.warning("%d queued spans were not exported before shutdown; dropped", lost)

    def spans_exported(self) -> int:
        """Spans the receiver accepted."""
        return self._ledger.exported()

    def spans_dropped(self) -> Mapping[str, int]:
        """Spans that did not reach the receiver, by reason (every reason, from 0)."""
        return self._ledger.dropped()
