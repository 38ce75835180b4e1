"""Per-tenant request rate limits: the ``max_requests_per_s`` quota as a token bucket.

Each tenant's bucket refills at its quota's rate and holds at most ``burst_s`` seconds of
requests (at least one), so a tenant may send a short burst after idling but never more than
its rate for long. A request finding the bucket empty is refused with ``RateLimitError`` (429)
and a Retry-After of the time until the next token. A cost above the capacity (a fan-out into
more engine requests than the bucket holds) passes on a full bucket and is taken whole: the
bucket owes the rest (below zero), and its refill pays that back before anything else passes.
The rate is read from the tenant record on every request (the registry reads it with the key),
so a quota change applies at once; a bucket owes at most what its current rate repays in
``MAX_WAIT_S`` (``debt_floor``), the longest Retry-After sent unless the rate's own gap between
two requests is longer (``longest_wait_s``).

``RateLimiter`` keeps the buckets in the HTTP process, one per tenant that has a quota (the
registry bounds their number): with N ingress processes a tenant gets N times its quota.
``shared_ratelimit.SharedRateLimiter`` keeps the same buckets in Redis, drawing on the
arithmetic here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from loraplex.errors import RateLimitError
from loraplex.registry import Tenant

DEFAULT_BURST_S = 1.0  # seconds of a tenant's rate its bucket holds
# The longest wait a bucket's debt may cost its next request: server/errors.MAX_RETRY_AFTER_S,
# the longest Retry-After sent at a rate of one request an hour or more (``longest_wait_s``;
# tests/server/test_ratelimit.py checks the two agree).
MAX_WAIT_S = 3600.0
# NOTE: float rounding: a bucket refilled for exactly the wait it reported may fall short by
# ~1e-14 tokens (at 1/161 a second, 161 s refill 0.99999999999998), and the client coming back
# after exactly its Retry-After was refused again. A shortfall this small is taken as none.
ROUNDING_TOKENS = 1e-9
# The longest delta-seconds a Retry-After states (RFC 9111 1.2.2: a larger one reads as this).
MAX_DELTA_SECONDS = 2**31


class TenantRateLimiter(Protocol):
    """Where ``RequestLimits`` charges a tenant's requests: in-process or shared buckets."""

    blocking: bool  # check() may wait on the network: call it off the event loop
    fallbacks: int  # checks answered by in-process buckets because Redis failed
    burst_s: float  # seconds of the rate a full bucket holds

    def check(self, tenant: Tenant, cost: float = 1.0, need: float | None = None) -> None: ...


def bucket_capacity(rate: float, burst_s: float) -> float:
    """Tokens a full bucket holds: ``burst_s`` seconds of ``rate``, and at least one request."""
    return max(1.0, rate * burst_s)


def tokens_needed(cost: float, capacity: float, need: float | None) -> float:
    """The tokens a bucket must hold for ``cost`` to be taken: ``need``, by default the cost,
    at most a full bucket (a larger cost could never pass otherwise; the bucket owes the rest)."""
    if not cost > 0:
        raise ValueError(f"cost {cost} is invalid; expected > 0")
    if need is None:
        return min(cost, capacity)
    if not 0 <= need <= min(cost, capacity):
        raise ValueError(f"need {need} is invalid; expected 0 to min(cost, capacity)")
    return need


def debt_floor(rate: float) -> float:
    """The fewest tokens a bucket refilling at ``rate`` may hold: the next request then waits
    ``MAX_WAIT_S`` at most. A fan-out admitted at this rate never goes below it (server/limits:
    ``max_engine_requests``); NOTE: a debt taken at a higher rate did, and the operator lowering
    the quota (1 to 0.001 a second after an ``n`` 16) left the tenant refused for 4.4 hours
    while each 429 said an hour. A rate below one request per ``MAX_WAIT_S`` owes nothing (its
    own gap is longer)."""
    return min(0.0, 1.0 - rate * MAX_WAIT_S)


def longest_wait_s(rate: float) -> float:
    """The longest wait a refusal at ``rate`` reports: ``MAX_WAIT_S`` (``debt_floor``), or the
    rate's own gap between two requests where that is longer (below one request per
    ``MAX_WAIT_S``: a bucket of one request owes nothing and refills in ``1 / rate``), at most
    ``MAX_DELTA_SECONDS``. NOTE: the hour alone told a tenant at one request per 2 h to come back
    after an hour, to be refused again."""
    return min(float(MAX_DELTA_SECONDS), max(MAX_WAIT_S, 1.0 / rate))


@dataclass
class _Bucket:
    tokens: float  # requests the tenant may send now
    updated_s: float  # clock time of the last refill


class RateLimiter:
    """Token buckets per tenant in this process, shared by its request handlers (thread-safe)."""

    blocking = False  # a lock and arithmetic: cheap enough for the event loop
    fallbacks = 0  # never falls back: it is the fallback

    def __init__(
        self, burst_s: float = DEFAULT_BURST_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not burst_s > 0:
            raise ValueError(f"burst_s {burst_s} is invalid; expected > 0")
        self.burst_s = burst_s
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, _Bucket] = {}

    def check(self, tenant: Tenant, cost: float = 1.0, need: float | None = None) -> None:
        """Takes ``cost`` tokens (engine requests: a request with ``n`` choices over ``p``
        prompts costs ``n * p``) from ``tenant``'s bucket when it holds ``need``
        (``tokens_needed``: by default the cost, at most a full bucket); RateLimitError when it
        holds fewer. A cost above what the bucket holds leaves it owing the rest (module
        docstring)."""
        rate = tenant.quotas.max_requests_per_s
        if rate is None:
            return
        capacity = bucket_capacity(rate, self.burst_s)
        need = tokens_needed(cost, capacity, need)
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(tenant.name)
            if bucket is None:
                bucket = self._buckets[tenant.name] = _Bucket(capacity, now)
            refilled = min(capacity, bucket.tokens + (now - bucket.updated_s) * rate)
            bucket.tokens = max(debt_floor(rate), refilled)
            bucket.updated_s = now
            if bucket.tokens >= need - ROUNDING_TOKENS:
                bucket.tokens -= cost
                return
            wait_s = (need - bucket.tokens) / rate
        raise RateLimitError(tenant.name, rate, wait_s)
