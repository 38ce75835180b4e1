"""``Tracer``: keeps or drops each finished request's trace, and exports the kept ones over
OTLP/HTTP (needs the ``otel`` extra).

Tail sampling: the decision waits for the request's end. A failed request is kept whatever the
ratio within its tenant's share of the export queue for errors (``share.py``: past it the failure
is decided by the rules below and, dropped, counted in ``errors_dropped``); a request slower than
``slow_s`` is kept whatever the ratio within its tenant's share for slow requests (a bucket of its
own: a tenant making deliberately slow requests, long ``max_tokens`` or slow reading, would
otherwise fill the queue; past it counted in ``slow_dropped`` when dropped); the others are kept
when the caller's ``traceparent`` said sampled (within its tenant's share for flags, a bucket of
its own: past it the flag is not honoured, counted in ``parent_refused``), else by ``sample_ratio``
on the trace id (as OpenTelemetry's TraceIdRatioBased), keyed-hashed first when the caller's
``traceparent`` chose it. Until then a request costs only a few timestamps. Kept spans go to the
SDK's ``BatchSpanProcessor`` (a bounded queue, exported on its own thread): the event loop never
waits for the collector, and a collector that is down costs dropped spans, never requests; each
span that does not reach it is counted by reason (``delivery.py``, ``spans_dropped``).

Each forced trace (error, slow, parent) also draws on its tenant's share of all three kinds
(``tenant_burst_spans``): the three shares alone let one tenant hold three of them at once.
Past it a forced reason is refused as past its own share, and counted the same way.
"""

from __future__ import annotations

import logging
import random
import secrets
import time
from collections import Counter
from collections.abc import Callable, Mapping

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor

from loraplex.tracing.config import TracingConfig
from loraplex.tracing.context import SpanIds, keyed_trace_id, ratio_keeps, root_ids
from loraplex.tracing.delivery import SpanDelivery
from loraplex.tracing.names import NameMasker
from loraplex.tracing.record import Interval, RequestTrace, Subject
from loraplex.tracing.share import SpanShare
from loraplex.tracing.spans import SpanBuilder

_log = logging.getLogger(__name__)


class Tracer:
    """Starts request traces and exports the kept ones (see the module docstring)."""

    def __init__(
        self,
        config: TracingConfig,
        base_model: str,
        *,
        rng: random.Random | None = None,
        now_ns: Callable[[], int] = time.time_ns,
        processor: SpanProcessor | None = None,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._rng = rng or random.Random(secrets.randbits(64))
        self._now_ns = now_ns
        resource = Resource.create({"service.name": config.service_name})
        mask = NameMasker(config.secret, config.export_names)
        self._builder = SpanBuilder(resource, mask, base_model, self._rng)
        # Every span that does not reach the receiver is counted there (a test's own processor
        # counts nothing: ``spans_dropped`` is then empty).
        self._delivery: SpanDelivery | None = None
        if processor is None:
            exporter = OTLPSpanExporter(endpoint=config.endpoint, timeout=config.export_timeout_s)
            processor = self._delivery = SpanDelivery(exporter, config.max_queue_spans)
        self._processor = processor
        self.num_kept = 0  # traces exported (handed to the processor)
        self.num_dropped = 0  # traces the sampling decision dropped
        self.num_failed = 0  # kept traces whose spans could not be built (logged)
        self.num_spans = 0  # spans of kept traces handed to the processor
        # A forced trace draws on its kind's share and on its tenant's share of all three kinds,
        # so one tenant holds at most ``tenant_burst_spans`` (and one trace) of the queue at once.
        self._shares = {
            "parent": SpanShare(config.parent_burst_spans, config.parent_spans_per_s, clock_s),
            "error": SpanShare(config.error_burst_spans, config.error_spans_per_s, clock_s),
            "slow": SpanShare(config.slow_burst_spans, config.slow_spans_per_s, clock_s),
        }
        self._tenant_share = SpanShare(
            config.tenant_burst_spans, config.tenant_spans_per_s, clock_s
        )
        # requests whose sampled flag was not honoured (tenant past its share), by tenant class
        self._parent_refused: Counter[str] = Counter()
        # failed requests dropped because their tenant was past its error share, by tenant class
        self._errors_dropped: Counter[str] = Counter()
        # slow requests dropped because their tenant was past its slow share, by tenant class
        self._slow_dropped: Counter[str] = Counter()

    def begin(
        self, traceparent: str | None, subject: Subject, authorization: Interval | None
    ) -> RequestTrace:
        """A new request's trace (under the caller's span when ``traceparent`` is valid)."""
        # The request began with its key check (in the middleware, before the handler).
        start_ns = self._now_ns() if authorization is None else authorization.start_ns
        trace = RequestTrace(
            root_ids(traceparent, self._rng), subject, start_ns, self._finish, self._now_ns
        )
        trace.authorization = authorization
        return trace

    def kept_by(self, trace: RequestTrace) -> str | None:
        """Why ``trace`` is kept ("error", "slow", "parent", "ratio"); None: dropped."""
        tenant = trace.subject.tenant
        if trace.is_error and self._has_room("error", tenant):
            return "error"
        if self._is_slow(trace) and self._has_room("slow", tenant):
            return "slow"
        if trace.ids.parent_sampled and self._has_room("parent", tenant):
            return "parent"
        if ratio_keeps(self._ratio_id(trace.ids), self.config.sample_ratio):
            return "ratio"
        return None

    def parent_refused(self) -> Mapping[str, int]:
        """Requests whose caller's sampled flag was not honoured (its tenant past its share of
        the export queue for flags, or past its share of all kinds), by tenant class."""
        return dict(self._parent_refused)

    def errors_dropped(self) -> Mapping[str, int]:
        """Failed requests whose trace was dropped because their tenant had used its share of
        the export queue for errors or of all kinds (and no other rule kept it), by tenant
        class."""
        return dict(self._errors_dropped)

    def slow_dropped(self) -> Mapping[str, int]:
        """Slow requests whose trace was dropped because their tenant had used its share of the
        export queue for slow requests or of all kinds (and no other rule kept it), by tenant
        class."""
        return dict(self._slow_dropped)

    def spans_exported(self) -> int:
        """Spans the receiver accepted."""
        return 0 if self._delivery is None else self._delivery.spans_exported()

    def spans_dropped(self) -> Mapping[str, int]:
        """Spans of kept traces that did not reach the receiver, by reason
        (``delivery.DROP_REASONS``: a full queue, a failed export, shutdown)."""
        return {} if self._delivery is None else self._delivery.spans_dropped()

    def traces_build_failed(self) -> int:
        """Kept traces whose spans could not be built (``num_failed``; each logged): none of
        their spans was made, so neither span counter sees them."""
        return self.num_failed

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Exports what is queued; False when that did not finish within ``timeout_s``."""
        return self._processor.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        self._processor.shutdown()

    def _finish(self, trace: RequestTrace) -> None:
        reason = self.kept_by(trace)
        tenant_class = trace.subject.tenant_class
        if trace.ids.parent_sampled and reason in ("ratio", None):
            self._parent_refused[tenant_class] += 1
        if reason is None:
            self.num_dropped += 1
            if trace.is_error:
                self._errors_dropped[tenant_class] += 1
            if self._is_slow(trace):
                self._slow_dropped[tenant_class] += 1
            return
        try:
            spans = self._builder.build(trace, reason)
        except Exception:  # a trace is an observation: it must never fail the request
            _log.exception("request trace %032x could not be built; dropped", trace.ids.trace_id)
            self.num_failed += 1
            return
        self.num_kept += 1
        share = self._shares.get(reason)
        if share is not None:  # forced past the ratio: charged to its kind and its tenant
            share.charge(trace.subject.tenant, len(spans))
            self._tenant_share.charge(trace.subject.tenant, len(spans))
        self.num_spans += len(spans)
        for span in spans:
            self._processor.on_end(span)

    def _ratio_id(self, ids: SpanIds) -> int:
        """What the ratio decides on: a trace id made here as it is, a caller's keyed-hashed.
        NOTE: a caller's ``traceparent`` chooses its trace id; one whose low 64 bits are 0 was
        kept at any ratio above 0, charged to no share, on every request."""
        if ids.parent_id is None:
            return ids.trace_id
        return keyed_trace_id(self.config.secret, ids.trace_id)

    def _has_room(self, kind: str, tenant: str) -> bool:
        return self._shares[kind].has_room(tenant) and self._tenant_share.has_room(tenant)

    def _is_slow(self, trace: RequestTrace) -> bool:
        slow_s = self.config.slow_s
        return slow_s is not None and trace.duration_s >= slow_s
