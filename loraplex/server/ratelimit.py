"""Per-tenant request rate limits: the ``max_requests_per_s`` quota as a token bucket.

Each tenant's bucket refills at its quota's rate and holds at most ``burst_s`` seconds of
requests (at least one), so a tenant may send a short burst after idling but never more than
its rate for long. A request finding the bucket empty is refused with ``RateLimitError`` (429)
and a Retry-After of the time until the next token. The rate is read from the tenant record on
every request (the registry reads it with the key), so a quota change applies at once. Buckets
live in the HTTP process, one per tenant that has a quota; the registry bounds their number.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from loraplex.errors import RateLimitError
from loraplex.registry import Tenant

DEFAULT_BURST_S = 1.0  # seconds of a tenant's rate its bucket holds


@dataclass
class _Bucket:
    tokens: float  # requests the tenant may send now
    updated_s: float  # clock time of the last refill


class RateLimiter:
    """Token buckets per tenant, shared by every request handler (thread-safe)."""

    def __init__(
        self, burst_s: float = DEFAULT_BURST_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not burst_s > 0:
            raise ValueError(f"burst_s {burst_s} is invalid; expected > 0")
        self.burst_s = burst_s
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, _Bucket] = {}

    def check(self, tenant: Tenant, cost: float = 1.0) -> None:
        """Takes ``cost`` tokens (engine requests: a request with ``n`` choices over ``p``
        prompts costs ``n * p``) from ``tenant``'s bucket; RateLimitError when it holds fewer.
        A cost above the bucket's capacity takes a full bucket (it could never pass otherwise)."""
        rate = tenant.quotas.max_requests_per_s
        if rate is None:
            return
        if not cost > 0:
            raise ValueError(f"cost {cost} is invalid; expected > 0")
        capacity = max(1.0, rate * self.burst_s)
        cost = min(cost, capacity)
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(tenant.name)
            if bucket is None:
                bucket = self._buckets[tenant.name] = _Bucket(capacity, now)
            bucket.tokens = min(capacity, bucket.tokens + (now - bucket.updated_s) * rate)
            bucket.updated_s = now
            if bucket.tokens >= cost:
                bucket.tokens -= cost
                return
            wait_s = (cost - bucket.tokens) / rate
        raise RateLimitError(tenant.name, rate, wait_s)
