"""Request traces (OpenTelemetry, OTLP/HTTP): one trace per request, through the front, the
engine (its own process or a fleet replica) and, in a fleet, the ingress.

- ``config``: ``TracingConfig`` (off unless an endpoint is set; sampling ratio, slow bound,
  whether names are exported or keyed hashes).
- ``context``: W3C ``traceparent`` parsing and making, ids, the ratio decision.
- ``record``: ``RequestTrace``, what the front stamps while a request runs (no OpenTelemetry).
- ``spans``: a finished ``RequestTrace`` as OpenTelemetry spans (GenAI + ``loraplex.*``).
- ``exporter``: ``Tracer``: decides whether a finished request is kept (tail sampling: errors
  and slow requests always) and hands its spans to the OTLP exporter's batch processor.
- ``delivery``: ``SpanDelivery``, that batch processor with every span that does not reach the
  receiver counted by reason (a full queue, a failed export, shutdown).

Only ``spans``, ``delivery`` and ``exporter`` import OpenTelemetry (the ``otel`` extra), and only
when a server is configured with an endpoint.
"""
