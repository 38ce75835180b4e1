"""``TracingConfig``: the tracing settings ``loraplex serve`` hands the front (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

MIN_SECRET_BYTES = 16  # the HMAC key for exported names
MAX_QUEUE_SPANS = 1 << 16  # spans waiting for export, at most (the batch processor drops beyond)


@dataclass(frozen=True)
class TracingConfig:
    """Where and what to export."""

    endpoint: str  # OTLP/HTTP traces URL, e.g. http://collector:4318/v1/traces
    secret: bytes = field(repr=False)  # HMAC key hashing tenant/adapter names (never exported)
    sample_ratio: float = 0.01  # fraction of requests kept by trace id (0-1)
    slow_s: float | None = 10.0  # requests this long are kept (within the slow share); None: off
    export_names: bool = False  # tenant/adapter names as they are; false: keyed hashes
    service_name: str = "loraplex"  # the ``service.name`` resource attribute
    max_queue_spans: int = 8192  # spans waiting for export; beyond, new ones are dropped
    export_timeout_s: float = 10.0  # one OTLP POST
    # What one tenant's forced traces of all three kinds below may keep together (``share.py``):
    # spans at once, then spans a second; each kind draws on its own share and on this one.
    tenant_burst_spans: int = 1024  # an eighth of the default queue
    tenant_spans_per_s: float = 200.0
    # What one tenant's sampled ``traceparent`` headers may keep: past it its requests are
    # sampled as if they carried no flag. Half the tenant's share: any request may carry the
    # flag, so flags alone never leave its failures and slow requests without room.
    parent_burst_spans: int = 512
    parent_spans_per_s: float = 100.0
    # What one tenant's failed requests may keep, the same way (a bucket of its own): past it a
    # failure is counted (``errors_dropped``) and sampled by the other rules.
    error_burst_spans: int = 1024
    error_spans_per_s: float = 200.0
    # What one tenant's slow requests (``slow_s``) may keep, the same way (a bucket of its own):
    # past it a slow request is counted (``slow_dropped``) and sampled by the other rules.
    slow_burst_spans: int = 1024
    slow_spans_per_s: float = 200.0

    def __post_init__(self) -> None:
        check_trace_settings(self.endpoint, self.sample_ratio, self.slow_s)
        if len(self.secret) < MIN_SECRET_BYTES:
            raise ValueError(
                f"trace secret of {len(self.secret)} bytes is invalid; expected at least "
                f"{MIN_SECRET_BYTES}"
            )
        if not 1 <= self.max_queue_spans <= MAX_QUEUE_SPANS:
            raise ValueError(
                f"max_queue_spans {self.max_queue_spans} is invalid; expected 1 to "
                f"{MAX_QUEUE_SPANS}"
            )
        _check_share("tenant", self.tenant_burst_spans, self.tenant_spans_per_s)
        _check_share("parent", self.parent_burst_spans, self.parent_spans_per_s)
        _check_share("error", self.error_burst_spans, self.error_spans_per_s)
        _check_share("slow", self.slow_burst_spans, self.slow_spans_per_s)
        if not self.export_timeout_s > 0:
            raise ValueError(f"export_timeout_s {self.export_timeout_s} is invalid; expected > 0")


def _check_share(kind: str, burst_spans: int, spans_per_s: float) -> None:
    if burst_spans < 1:
        raise ValueError(f"{kind}_burst_spans {burst_spans} is invalid; expected >= 1")
    if not spans_per_s > 0:
        raise ValueError(f"{kind}_spans_per_s {spans_per_s} is invalid; expected > 0")


def check_trace_settings(endpoint: str | None, sample_ratio: float, slow_s: float | None) -> None:
    """ValueError naming the serve setting (``trace_*``) that is out of range."""
    if endpoint is not None:
        url = urlsplit(endpoint)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise ValueError(
                f"trace_endpoint {endpoint!r} is invalid; expected an http(s):// URL "
                "(OTLP/HTTP, e.g. http://collector:4318/v1/traces)"
            )
    if not 0.0 <= sample_ratio <= 1.0:
        raise ValueError(f"trace_sample_ratio {sample_ratio} is invalid; expected 0 to 1")
    if slow_s is not None and not slow_s > 0:
        raise ValueError(f"trace_slow_s {slow_s} is invalid; expected > 0")
