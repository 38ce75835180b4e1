"""``SpanShare``: how much of the shared span export queue one tenant may fill with traces it
forces past the sample ratio (torch-free, no OpenTelemetry).

Two kinds of request force their trace to be kept: one whose caller's ``traceparent`` says
sampled, and one that failed. The export queue (a bounded ``BatchSpanProcessor`` that drops
*new* spans when full) is shared by every tenant: a tenant sending the flag on every request, or
making cheap failures (404s, 400s) as fast as its rate limit allows, could fill it, and other
tenants' traces would be dropped. So each tenant's forced traces of one kind draw on a token
bucket counted in spans (the tracer holds one ``SpanShare`` per kind, so a tenant's own flags
take at most their share, and one more over all kinds, so the kinds together take at most
the tenant's whole share): a full bucket holds ``burst_spans`` and refills at
``spans_per_s``. A trace is let in while its tenant's bucket holds anything and then charged its
spans (so a bucket may go below zero by one trace's spans: a trace's span count is known only
once built). Past it the request is decided by the tracer's other rules.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

MAX_TENANTS = 4096  # buckets kept at most: then full ones (which act as new ones) are forgotten


class _Bucket:
    def __init__(self, tokens: float, stamp_s: float) -> None:
        self.tokens = tokens  # spans the tenant may still force (below 0: in debt)
        self.stamp_s = stamp_s  # when ``tokens`` was last refilled


class SpanShare:
    """Per-tenant span buckets for one kind of forced trace (module docstring); thread-safe."""

    def __init__(
        self,
        burst_spans: int,
        spans_per_s: float,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self._burst = float(burst_spans)
        self._rate = spans_per_s
        self._clock_s = clock_s
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def has_room(self, tenant: str) -> bool:
        """Whether ``tenant``'s next forced trace is let in (nothing is taken yet)."""
        with self._lock:
            return self._refilled(tenant).tokens > 0

    def charge(self, tenant: str, num_spans: int) -> None:
        """``tenant``'s forced trace, let in, cost ``num_spans`` spans."""
        with self._lock:
            self._refilled(tenant).tokens -= num_spans

    def _refilled(self, tenant: str) -> _Bucket:
        now_s = self._clock_s()
        bucket = self._buckets.get(tenant)
        if bucket is None:
            if len(self._buckets) >= MAX_TENANTS:
                self._forget_full(now_s)
            bucket = self._buckets[tenant] = _Bucket(self._burst, now_s)
        elapsed_s = max(0.0, now_s - bucket.stamp_s)
        bucket.tokens = min(self._burst, bucket.tokens + elapsed_s * self._rate)
        bucket.stamp_s = now_s
        return bucket

    def _forget_full(self, now_s: float) -> None:
        """Forgets every full bucket; when none is full, the one nearest to full (so the table
        never passes ``MAX_TENANTS``, and forgetting a bucket pardons as little debt as it can:
        a deep debtor stays)."""
        tokens = {
            tenant: bucket.tokens + max(0.0, now_s - bucket.stamp_s) * self._rate
            for tenant, bucket in self._buckets.items()
        }
        full = [tenant for tenant, count in tokens.items() if count >= self._burst]
        for tenant in full or [max(tokens, key=tokens.__getitem__)]:
            del self._buckets[tenant]
