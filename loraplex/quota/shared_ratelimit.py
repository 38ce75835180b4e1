"""Per-tenant rate buckets shared through Redis: every ingress process using one Redis and key
prefix draws on the same bucket, so N processes admit a tenant's quota once (the bucket's
arithmetic is ``ratelimit.py``'s, run atomically in a Lua script). ``open_rate_limiter`` picks
these or the in-process ``RateLimiter`` from the ``shared_state_url`` setting.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, cast
from urllib.parse import urlsplit

from loraplex.artifacts.identity import check_name
from loraplex.errors import RateLimitError, quoted
from loraplex.quota.ratelimit import (
    DEFAULT_BURST_S,
    MAX_DELTA_SECONDS,
    ROUNDING_TOKENS,
    RateLimiter,
    TenantRateLimiter,
    bucket_capacity,
    debt_floor,
    tokens_needed,
)
from loraplex.registry import Tenant

if TYPE_CHECKING:
    import redis

_log = logging.getLogger(__name__)

DEFAULT_KEY_PREFIX = "loraplex"  # Redis keys are ``<prefix>:rl:<tenant>``
# One deployment's keys in a Redis other deployments may share: a short name, no spaces.
_KEY_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
SHARED_STATE_SCHEMES = ("redis", "rediss")  # rediss: Redis over TLS
# Redis sits on the request path: a slow or dead one must cost a request little. Connect and
# read both give up after this, and redis-py's own retries are off (the fallback is ours).
REDIS_CONNECT_TIMEOUT_S = 0.25
REDIS_READ_TIMEOUT_S = 0.25
# After Redis failed, checks use the in-process buckets this long before Redis is tried again,
# so a dead Redis adds its timeout to one request per interval, not to every request.
REDIS_RETRY_S = 1.0
REDIS_MAX_CONNECTIONS = 64  # per process; above the thread pool's size, so none waits for one
# A bucket left alone for a full refill holds exactly what a new one does, so its key may
# expire then: after this many refill times (margin for clock steps), at least 1 s, at most that
# many of the longest Retry-After (Redis's expiry is bounded). NOTE: at most a week, a rate
# below one request per 2.3 days was forgiven after a week while its 429 said to wait longer.
TTL_REFILLS = 3.0
MIN_TTL_S = 1.0
MAX_TTL_S = TTL_REFILLS * MAX_DELTA_SECONDS

# KEYS[1]: one tenant's bucket, a hash {tokens, updated_s}. ARGV: rate (tokens/s), capacity,
# cost, need (the tokens the bucket must hold for the cost to be taken, at most the capacity;
# the bucket may owe the rest), a full bucket's TTL in ms (one in debt lives longer by the
# debt's share), the fewest tokens it may hold (``debt_floor``), ``ROUNDING_TOKENS``, and
# optionally "now" in seconds (tests only; otherwise Redis's TIME, the one clock every ingress
# process shares).
# Returns {1, "0"} when the cost was taken, {0, seconds until it could be} when refused.
# NOTE: TIME before a write needs effect replication (the default since Redis 5).
_TAKE_SCRIPT = """
local rate, capacity, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local need = tonumber(ARGV[4])
local now
if ARGV[8] then
  now = tonumber(ARGV[8])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local state = redis.call('HMGET', KEYS[1], 'tokens', 'updated_s')
local tokens, updated = tonumber(state[1]), tonumber(state[2])
if not tokens or not updated then
  tokens, updated = capacity, now
end
tokens = math.min(capacity, tokens + math.max(0, now - updated) * rate)
tokens = math.max(tonumber(ARGV[6]), tokens)
local taken = tokens >= need - tonumber(ARGV[7])
if taken then tokens = tokens - cost end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens),
  'updated_s', string.format('%.17g', math.max(now, updated)))
local ttl = tonumber(ARGV[5])
redis.call('PEXPIRE', KEYS[1], math.ceil(ttl * math.max(1, (capacity - tokens) / capacity)))
if taken then return {1, '0'} end
return {0, string.format('%.17g', (need - tokens) / rate)}
"""
_TAKE_SHA = hashlib.sha1(_TAKE_SCRIPT.encode("utf-8"), usedforsecurity=False).hexdigest()


def check_key_prefix(key_prefix: str) -> str:
    if not isinstance(key_prefix, str) or not _KEY_PREFIX.fullmatch(key_prefix):
        raise ValueError(
            f"shared_state_prefix {quoted(key_prefix)} is invalid; expected 1-64 characters of "
            "[A-Za-z0-9._:-] starting with a letter or digit"
        )
    return key_prefix


def check_shared_state(url: str | None, key_prefix: str) -> None:
    """Both settings checked, and a prefix other than the default refused without a URL: it
    names keys in that Redis, so alone it did nothing (each process kept its own buckets)."""
    if url is not None:
        check_shared_state_url(url)
    check_key_prefix(key_prefix)
    if url is None and key_prefix != DEFAULT_KEY_PREFIX:
        raise ValueError(
            f"shared_state_prefix {quoted(key_prefix)} is set without shared_state_url; expected "
            "both (the prefix names keys in that Redis) or neither"
        )


def check_shared_state_url(url: str) -> str:
    """A ``redis://`` or ``rediss://`` URL; the error names only the scheme, never the rest (it
    may hold a password)."""
    if not isinstance(url, str):
        raise ValueError(
            f"shared_state_url of type {type(url).__name__} is invalid; expected a URL"
        )
    scheme = urlsplit(url).scheme if "://" in url else ""
    if scheme not in SHARED_STATE_SCHEMES:
        raise ValueError(
            f"shared_state_url scheme {scheme!r:.40} is invalid; expected redis:// or rediss:// "
            "(redis://[[user]:password@]host[:port][/db])"
        )
    return url


def redis_client(url: str) -> redis.Redis:
    """A client for ``url`` with the short timeouts above and no retries of its own. Connects
    lazily: a server started while Redis is down serves (per process) until it is up."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    check_shared_state_url(url)
    try:
        return redis.Redis.from_url(
            url,
            socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S,
            socket_timeout=REDIS_READ_TIMEOUT_S,
            retry=Retry(NoBackoff(), 0),
            max_connections=REDIS_MAX_CONNECTIONS,
        )
    except ValueError:  # its text may quote the URL
        raise ValueError(
            "shared_state_url is invalid; expected redis://[[user]:password@]host[:port][/db]"
        ) from None


class SharedRateLimiter:
    """Token buckets per tenant in Redis: every ingress process with the same Redis and key
    prefix draws on one bucket per tenant, so N processes admit a tenant's quota once.

    Each check is one atomic Lua script (refill, take, expire) on Redis's clock, so the ingress
    clocks do not matter. When Redis is unreachable or errors, the check is answered by an
    in-process ``RateLimiter`` instead: each process then still bounds the tenant, but per
    process (N processes admit up to N times the quota) until Redis answers again. An outage is
    logged once, each check it answers is counted in ``fallbacks``, and Redis is tried again
    only every ``REDIS_RETRY_S``.
    """

    blocking = True  # waits on Redis (at most the socket timeouts)

    def __init__(
        self,
        client: redis.Redis,
        *,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        burst_s: float = DEFAULT_BURST_S,
        clock: Callable[[], float] = time.monotonic,
        bucket_clock: Callable[[], float] | None = None,
    ) -> None:
        """``clock`` times the retry interval and the fallback buckets; ``bucket_clock`` (tests
        only) replaces Redis's TIME in the script."""
        from redis.exceptions import NoScriptError, RedisError

        self._local = RateLimiter(burst_s, clock)  # checks burst_s
        self.key_prefix = check_key_prefix(key_prefix)
        self.burst_s = burst_s
        self.fallbacks = 0  # checks answered in-process because Redis failed
        self._client = client
        self._clock = clock
        self._bucket_clock = bucket_clock
        self._lock = threading.Lock()
        self._retry_at_s: float | None = None  # set while Redis is failing: next try
        self._no_script = NoScriptError
        self._failures: tuple[type[Exception], ...] = (RedisError, OSError)

    def key(self, tenant_name: str) -> str:
        """The Redis key of ``tenant_name``'s bucket (a checked name: bounded, no spaces)."""
        return f"{self.key_prefix}:rl:{check_name('tenant', tenant_name)}"

    def check(self, tenant: Tenant, cost: float = 1.0, need: float | None = None) -> None:
        """``RateLimiter.check``'s contract, on the shared bucket (class docstring)."""
        rate = tenant.quotas.max_requests_per_s
        if rate is None:
            return
        capacity = bucket_capacity(rate, self.burst_s)
        need = tokens_needed(cost, capacity, need)
        if not self._redis_due():
            self._check_locally(tenant, cost, need)
            return
        try:
            taken, wait_s = self._take(self.key(tenant.name), rate, capacity, cost, need)
        except self._failures as exc:
            self._note_failure(exc)
            self._check_locally(tenant, cost, need)
            return
        self._note_success()
        if not taken:
            raise RateLimitError(tenant.name, rate, wait_s)

    def close(self) -> None:
        self._client.close()

    def _take(
        self, key: str, rate: float, capacity: float, cost: float, need: float
    ) -> tuple[bool, float]:
        ttl_s = min(MAX_TTL_S, max(MIN_TTL_S, TTL_REFILLS * capacity / rate))
        args: list[float | int] = [rate, capacity, cost, need, math.ceil(ttl_s * 1000)]
        args += [debt_floor(rate), ROUNDING_TOKENS]
        if self._bucket_clock is not None:
            args.append(self._bucket_clock())
        try:
            reply = self._client.evalsha(_TAKE_SHA, 1, key, *args)
        except self._no_script:  # first use on this Redis, or its scripts were flushed
            reply = self._client.eval(_TAKE_SCRIPT, 1, key, *args)
        taken, wait_s = cast(list[int | bytes], reply)
        return taken == 1, float(wait_s)

    def _redis_due(self) -> bool:
        with self._lock:
            return self._retry_at_s is None or self._clock() >= self._retry_at_s

    def _check_locally(self, tenant: Tenant, cost: float, need: float) -> None:
        with self._lock:
            self.fallbacks += 1
        self._local.check(tenant, cost, need)

    def _note_failure(self, exc: Exception) -> None:
        with self._lock:
            first = self._retry_at_s is None
            self._retry_at_s = self._clock() + REDIS_RETRY_S
        if first:
            _log.warning(
                "shared rate limits unavailable (%s: %s); each process limits tenants on its own "
                "until Redis answers again",
                type(exc).__name__,
                exc,
            )

    def _note_success(self) -> None:
        if self._retry_at_s is None:  # the common case, without the lock
            return
        with self._lock:
            recovered = self._retry_at_s is not None
            self._retry_at_s = None
        if recovered:
            _log.warning("shared rate limits restored: Redis answers again")


def open_rate_limiter(url: str | None, key_prefix: str = DEFAULT_KEY_PREFIX) -> TenantRateLimiter:
    """In-process buckets when ``url`` is None, else buckets shared through the Redis at
    ``url`` (``redis://`` or ``rediss://``) under ``key_prefix``."""
    if url is None:
        return RateLimiter()
    return SharedRateLimiter(redis_client(url), key_prefix=key_prefix)
