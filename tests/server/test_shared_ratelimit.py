"""Tenant rate buckets shared through Redis (``SharedRateLimiter``): every ingress process draws
on one bucket per tenant, with ``RateLimiter``'s semantics; a failing Redis falls back to
per-process buckets without failing a request.

Redis: ``LORAPLEX_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``); each test uses its own
key prefix and deletes its keys. An unreachable Redis skips locally and FAILS when ``CI=true``.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import ADMIN_KEY, BASE_NAME, Served, make_app_deps
from fakes import FakeEngine, on_event_loop
from fastapi.testclient import TestClient

from loraplex.demo.assets import DemoAssets
from loraplex.errors import RateLimitError
from loraplex.quota.ratelimit import RateLimiter
from loraplex.quota.shared_ratelimit import (
    REDIS_RETRY_S,
    SharedRateLimiter,
    open_rate_limiter,
    redis_client,
)
from loraplex.registry import PriorityClass, Tenant, TenantQuotas
from loraplex.serve.assembly import build_server
from loraplex.serve.config import ServeConfig
from loraplex.server import limits
from loraplex.server.app import create_app
from loraplex.server.deps import ServerConfig
from loraplex.server.errors import MAX_RETRY_AFTER_S, ErrorContext, to_api_error
from loraplex.server.limits import RequestLimits

REDIS_URL = os.environ.get("LORAPLEX_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
IN_CI = os.environ.get("CI", "").lower() == "true"


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class SpyClient:
    """A Redis client that counts script calls and can be switched off (a Redis outage)."""

    def __init__(self, real: redis.Redis) -> None:
        self.real = real
        self.down = False
        self.calls: list[str] = []  # "evalsha" / "eval", in order
        self.on_event_loop: list[bool] = []  # per call: was an event loop running in its thread

    def evalsha(self, *args: Any) -> Any:
        return self._call("evalsha", args)

    def eval(self, *args: Any) -> Any:
        return self._call("eval", args)

    def close(self) -> None:
        self.real.close()

    def _call(self, name: str, args: tuple[Any, ...]) -> Any:
        self.calls.append(name)
        self.on_event_loop.append(on_event_loop())
        if self.down:
            raise redis.ConnectionError("Redis is down (test)")
        return getattr(self.real, name)(*args)


def _tenant(name: str, rate: float | None) -> Tenant:
    return Tenant(name, PriorityClass.NORMAL, TenantQuotas(max_requests_per_s=rate), 0.0)


@pytest.fixture
def redis_url() -> str:
    client = redis_client(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        reason = f"no Redis reachable at {REDIS_URL} ({type(exc).__name__})"
        if IN_CI:
            pytest.fail(f"{reason} (CI=true: these tests must run in CI)")
        pytest.skip(reason)
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test alone; its keys are deleted after it."""
    name = f"lpxtest-{secrets.token_hex(6)}"
    yield name
    client = redis_client(redis_url)
    try:
        keys = list(client.scan_iter(f"{name}:*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    """A client for looking at the keys directly."""
    client = redis_client(redis_url)
    yield client
    client.close()


def _shared(url: str, prefix: str, **kwargs: Any) -> SharedRateLimiter:
    return SharedRateLimiter(redis_client(url), key_prefix=prefix, **kwargs)


def test_two_ingress_processes_share_one_tenant_budget(redis_url: str, prefix: str) -> None:
    now = Clock()
    first = _shared(redis_url, prefix, bucket_clock=now)
    second = _shared(redis_url, prefix, bucket_clock=now)  # its own client: another process
    tenant = _tenant("acme", 2.0)  # a bucket of two requests
    first.check(tenant)
    second.check(tenant)
    for limiter in (first, second):
        with pytest.raises(RateLimitError) as refused:
            limiter.check(tenant)
        assert refused.value.retry_after_s == pytest.approx(0.5)
    # Per-process buckets would have admitted two requests in each process.
    local = [RateLimiter(clock=Clock()), RateLimiter(clock=Clock())]
    for limiter in (*local, *local):
        limiter.check(tenant)
    assert (first.fallbacks, second.fallbacks) == (0, 0)
    first.close()
    second.close()


def test_on_redis_time_the_third_request_across_two_processes_is_refused(
    redis_url: str, prefix: str
) -> None:
    first, second = _shared(redis_url, prefix), _shared(redis_url, prefix)
    tenant = _tenant("acme", 0.01)  # one request, then one every 100 s
    first.check(tenant)
    with pytest.raises(RateLimitError) as refused:
        second.check(tenant)
    assert 0 < refused.value.retry_after_s <= 100
    first.close()
    second.close()


def test_the_bucket_refills_at_the_rate_up_to_its_capacity(redis_url: str, prefix: str) -> None:
    now = Clock()
    limiter = _shared(redis_url, prefix, bucket_clock=now)
    tenant = _tenant("acme", 2.0)
    limiter.check(tenant)
    limiter.check(tenant)
    now.now += 0.5  # one token back
    limiter.check(tenant)
    with pytest.raises(RateLimitError):
        limiter.check(tenant)
    now.now += 60.0  # long idle: the bucket holds its capacity (two), not 120
    limiter.check(tenant)
    limiter.check(tenant)
    with pytest.raises(RateLimitError):
        limiter.check(tenant)
    now.now += 0.1
    limiter.check(_tenant("acme", 100.0))  # a raised quota applies at once: 10 tokens back
    limiter.close()


def test_a_cost_above_the_capacity_passes_on_a_full_bucket_and_is_owed(
    redis_url: str, prefix: str, raw: redis.Redis
) -> None:
    """As ``RateLimiter`` (test_ratelimit.py); and the key of a bucket in debt lives until it
    refilled, three times over (expired sooner, the debt would be forgiven)."""
    now = Clock()
    limiter = _shared(redis_url, prefix, bucket_clock=now)
    tenant = _tenant("acme", 4.0)
    limiter.check(tenant, 3)
    with pytest.raises(RateLimitError) as refused:
        limiter.check(tenant, 2)  # one token left
    assert refused.value.retry_after_s == pytest.approx(0.25)
    now.now += 10.0
    limiter.check(tenant, 100)  # above the capacity of four: let in on a full bucket, owing 96
    now.now += 1.0  # a full bucket's refill later: still owing 92
    with pytest.raises(RateLimitError) as owing:
        limiter.check(tenant)
    assert owing.value.retry_after_s == pytest.approx(23.25)  # (1 + 92) / 4
    assert 3 * 23.5 * 1000 < raw.pttl(f"{prefix}:rl:acme") <= 3 * 24 * 1000  # 24 s to refill
    now.now += 23.25
    limiter.check(tenant)
    with pytest.raises(ValueError, match="cost 0 is invalid"):
        limiter.check(tenant, 0)
    limiter.close()


def test_a_quota_lowered_while_in_debt_leaves_at_most_the_longest_retry_after(
    redis_url: str, prefix: str
) -> None:
    """As ``RateLimiter`` (test_ratelimit.py): 15 owed at a new rate of 0.001 is 16,000 s, and
    the 429s said an hour; now the shared bucket owes at most its current rate's hour."""
    now = Clock()
    limiter = _shared(redis_url, prefix, bucket_clock=now)
    limiter.check(_tenant("acme", 1.0), 16)  # n=16 on a full bucket of 1: owing 15
    lowered = _tenant("acme", 0.001)
    with pytest.raises(RateLimitError) as owing:
        limiter.check(lowered)
    assert owing.value.retry_after_s == pytest.approx(MAX_RETRY_AFTER_S)
    now.now += MAX_RETRY_AFTER_S
    limiter.check(lowered)
    with pytest.raises(RateLimitError) as again:
        limiter.check(lowered)
    assert again.value.retry_after_s == pytest.approx(1000.0)
    limiter.close()


@pytest.mark.parametrize("gap_s", [161, 7200])
def test_coming_back_after_exactly_the_retry_after_passes(
    redis_url: str, prefix: str, gap_s: int
) -> None:
    """As ``RateLimiter`` (test_ratelimit.py): at 1/161 a second, 161 s refilled 0.99999999999998
    tokens and the client coming back after its Retry-After was refused again; at one request
    per 2 h the Retry-After said 3600."""
    now = Clock()
    limiter = _shared(redis_url, prefix, bucket_clock=now)
    tenant = _tenant("acme", 1 / gap_s)
    limiter.check(tenant)
    with pytest.raises(RateLimitError) as refused:
        limiter.check(tenant)
    retry_after = int(to_api_error(refused.value, ErrorContext.TENANT).headers["Retry-After"])
    assert retry_after == gap_s
    now.now += retry_after
    limiter.check(tenant)
    limiter.close()


def test_tenants_and_prefixes_have_their_own_buckets(
    redis_url: str, prefix: str, raw: redis.Redis
) -> None:
    now = Clock()
    limiter = _shared(redis_url, prefix, bucket_clock=now)
    slow, other, free = _tenant("slow", 0.5), _tenant("other", 1.0), _tenant("free", None)
    limiter.check(slow)
    with pytest.raises(RateLimitError):
        limiter.check(slow)
    limiter.check(other)
    for _ in range(100):
        limiter.check(free)
    assert sorted(raw.scan_iter(f"{prefix}:*")) == [
        f"{prefix}:rl:other".encode(),
        f"{prefix}:rl:slow".encode(),
    ]  # a tenant without a quota leaves nothing in Redis
    deployment = _shared(redis_url, f"{prefix}:b", bucket_clock=now)
    deployment.check(slow)  # another prefix: another deployment's bucket
    limiter.close()
    deployment.close()


def test_every_bucket_expires_a_few_refill_times_after_its_last_use(
    redis_url: str, prefix: str, raw: redis.Redis
) -> None:
    limiter = _shared(redis_url, prefix)
    limiter.check(_tenant("fast", 2.0))  # refills in 1 s: expires within 3 s
    limiter.check(_tenant("slow", 0.01))  # refills in 100 s: expires within 300 s
    fast_ms, slow_ms = raw.pttl(f"{prefix}:rl:fast"), raw.pttl(f"{prefix}:rl:slow")
    assert 0 < fast_ms <= 3000
    assert 3000 < slow_ms <= 300_000
    limiter.close()


def test_a_bucket_outlives_the_wait_its_refusal_states(
    redis_url: str, prefix: str, raw: redis.Redis
) -> None:
    """At one request per 10 days the 429 says 864,000 s; the key expired after a week (the
    tenant was forgiven 3 days early), now after 3 refill times, as at any other rate."""
    gap_s = 10 * 24 * 3600
    limiter = _shared(redis_url, prefix)
    tenant = _tenant("rare", 1 / gap_s)
    limiter.check(tenant)
    with pytest.raises(RateLimitError) as refused:
        limiter.check(tenant)
    assert refused.value.retry_after_s == pytest.approx(gap_s, rel=1e-3)
    assert gap_s * 1000 < raw.pttl(f"{prefix}:rl:rare") <= 3 * gap_s * 1000
    limiter.close()


def test_a_closed_port_falls_back_to_a_local_bucket_that_still_limits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    limiter = open_rate_limiter(f"redis://127.0.0.1:{port}/0")
    assert isinstance(limiter, SharedRateLimiter)
    tenant = _tenant("acme", 1.0)
    with caplog.at_level(logging.WARNING, logger="loraplex.quota.shared_ratelimit"):
        limiter.check(tenant)  # no exception: answered in-process
        with pytest.raises(RateLimitError):
            limiter.check(tenant)
    assert limiter.fallbacks == 2
    assert len(caplog.records) == 1  # one outage, logged once
    limiter.close()


def test_an_outage_is_retried_after_a_back_off_and_recovers(
    redis_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    spy = SpyClient(redis_client(redis_url))
    limiter = SharedRateLimiter(spy, key_prefix=prefix, clock=clock)  # type: ignore[arg-type]
    tenant = _tenant("acme", 0.01)
    spy.down = True
    with caplog.at_level(logging.WARNING, logger="loraplex.quota.shared_ratelimit"):
        limiter.check(tenant)
        for _ in range(5):  # within the back-off: Redis is not asked
            with pytest.raises(RateLimitError):
                limiter.check(tenant)
        assert spy.calls == ["evalsha"]
        clock.now += REDIS_RETRY_S
        with pytest.raises(RateLimitError):
            limiter.check(tenant)  # asked again, still down
        assert spy.calls == ["evalsha", "evalsha"]
        assert limiter.fallbacks == 7
        spy.down = False
        clock.now += REDIS_RETRY_S
        limiter.check(tenant)  # the shared bucket is still full: only the local one was used
        with pytest.raises(RateLimitError):
            limiter.check(tenant)
    assert limiter.fallbacks == 7
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and "unavailable" in messages[0] and "restored" in messages[1]
    limiter.close()


def test_a_flushed_script_cache_falls_back_to_eval_once(
    redis_url: str, prefix: str, raw: redis.Redis
) -> None:
    spy = SpyClient(redis_client(redis_url))
    limiter = SharedRateLimiter(spy, key_prefix=prefix)  # type: ignore[arg-type]
    raw.script_flush()
    limiter.check(_tenant("acme", 10.0))
    limiter.check(_tenant("acme", 10.0))
    assert spy.calls == ["evalsha", "eval", "evalsha"]
    assert limiter.fallbacks == 0
    limiter.close()


def test_the_url_picks_the_limiter_and_is_validated() -> None:
    assert isinstance(open_rate_limiter(None), RateLimiter)
    for url in ("redis://127.0.0.1:6379/0", "rediss://cache.internal:6380/2", "redis://h"):
        limiter = open_rate_limiter(url, "tenant-a")
        assert isinstance(limiter, SharedRateLimiter) and limiter.key_prefix == "tenant-a"
        limiter.close()  # nothing connected yet: clients connect on first use
    for url, scheme in (
        ("http://user:hunter2@cache:6379", "'http'"),
        ("memcached://:hunter2@cache", "'memcached'"),
        ("cache:6379", "''"),
        ("", "''"),
    ):
        with pytest.raises(ValueError, match="shared_state_url scheme") as refused:
            open_rate_limiter(url)
        assert scheme in str(refused.value) and "hunter2" not in str(refused.value)
    with pytest.raises(ValueError, match="shared_state_url is invalid") as refused:
        open_rate_limiter("redis://:hunter2@cache:port/0")
    assert "hunter2" not in str(refused.value)
    for bad_prefix in ("", "two words", "-leading", "x" * 65):
        with pytest.raises(ValueError, match=r"shared_state_prefix .* is invalid"):
            open_rate_limiter("redis://h", bad_prefix)


def test_the_server_config_reaches_request_limits(served: Served) -> None:
    url = "redis://:hunter2@127.0.0.1:6379/3"
    deps = make_app_deps(served, FakeEngine(), shared_state_url=url, shared_state_prefix="blue")
    assert "hunter2" not in repr(deps.config)
    middleware = RequestLimits(create_app(deps), deps)
    limiter = middleware.rate_limiter
    assert isinstance(limiter, SharedRateLimiter) and limiter.key("acme") == "blue:rl:acme"
    limiter.close()
    plain_deps = make_app_deps(served, FakeEngine())
    assert isinstance(RequestLimits(create_app(plain_deps), plain_deps).rate_limiter, RateLimiter)
    with pytest.raises(ValueError, match="shared_state_url scheme 'http' is invalid"):
        ServerConfig(base_model_name="m", admin_key=ADMIN_KEY, shared_state_url="http://h")
    for deps_ in (deps, plain_deps):
        assert deps_.cache is not None
        deps_.cache.close()


def _tenant_token(client: TestClient, name: str, rate: float) -> dict[str, str]:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    assert client.post("/admin/tenants", json={"name": name}, headers=admin).status_code == 201
    quotas = {"quotas": {"max_requests_per_s": rate}}
    assert client.put(f"/admin/tenants/{name}", json=quotas, headers=admin).status_code == 200
    token = client.post(f"/admin/tenants/{name}/keys", headers=admin).json()["token"]
    return {"Authorization": f"Bearer {token}"}


def test_over_http_two_apps_share_a_tenant_budget(
    served: Served, redis_url: str, prefix: str
) -> None:
    shared = {"shared_state_url": redis_url, "shared_state_prefix": prefix}
    body = {"model": BASE_NAME, "prompt": "hi", "max_tokens": 2}
    name = f"fleet-{secrets.token_hex(4)}"
    apps = [make_app_deps(served, FakeEngine(), **shared) for _ in range(2)]
    with TestClient(create_app(apps[0])) as one, TestClient(create_app(apps[1])) as two:
        headers = _tenant_token(one, name, 0.01)  # one request, then one every 100 s
        assert one.post("/v1/completions", json=body, headers=headers).status_code == 200
        refused = two.post("/v1/completions", json=body, headers=headers)
        assert refused.status_code == 429  # the other ingress drew on the same bucket
        assert refused.json()["error"]["code"] == "rate_limited"
        assert int(refused.headers["Retry-After"]) >= 1
    # Without shared state each app admits the tenant's request on its own budget.
    local = [make_app_deps(served, FakeEngine()) for _ in range(2)]
    with TestClient(create_app(local[0])) as one, TestClient(create_app(local[1])) as two:
        other = _tenant_token(one, f"{name}-local", 0.01)
        assert one.post("/v1/completions", json=body, headers=other).status_code == 200
        assert two.post("/v1/completions", json=body, headers=other).status_code == 200
    for deps in (*apps, *local):
        assert deps.cache is not None
        deps.cache.close()


def test_over_http_the_shared_check_runs_off_the_event_loop(
    served: Served, redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = SpyClient(redis_client(redis_url))
    limiter = SharedRateLimiter(spy, key_prefix=prefix)  # type: ignore[arg-type]
    monkeypatch.setattr(limits, "open_rate_limiter", lambda url, key_prefix: limiter)
    deps = make_app_deps(served, FakeEngine(), shared_state_url=redis_url)
    body = {"model": BASE_NAME, "prompt": "hi", "max_tokens": 2}
    with TestClient(create_app(deps)) as client:
        headers = _tenant_token(client, f"offloop-{secrets.token_hex(4)}", 0.01)
        assert client.post("/v1/completions", json=body, headers=headers).status_code == 200
        assert client.post("/v1/completions", json=body, headers=headers).status_code == 429
    assert spy.calls and spy.on_event_loop == [False] * len(spy.calls)
    limiter.close()
    assert deps.cache is not None
    deps.cache.close()


def test_build_server_hands_the_shared_state_to_the_http_layer(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    url = "redis://127.0.0.1:6379/5"  # never connected to here: clients connect on first use
    config = ServeConfig(
        data_dir=tmp_path,
        model=demo_assets.base_model_dir,
        demo=False,
        admin_key=ADMIN_KEY,
        max_loras=2,
        max_num_seqs=2,
        engine_process=False,
        shared_state_url=url,
        shared_state_prefix="green",
    )
    server = build_server(config)
    try:
        settings = server.deps.config
        assert (settings.shared_state_url, settings.shared_state_prefix) == (url, "green")
    finally:
        server.close()


def test_over_http_a_fan_out_no_retry_after_could_repay_is_refused_on_the_shared_bucket(
    served: Served, redis_url: str, prefix: str
) -> None:
    """As with in-process buckets (``test_ratelimit.py``): a fan-out whose debt would pass the
    longest Retry-After is a 400 before it is charged, and the largest one that passes leaves
    an honest Retry-After on the shared bucket."""
    shared = {"shared_state_url": redis_url, "shared_state_prefix": prefix}
    deps = make_app_deps(served, FakeEngine(), **shared)
    body = {"model": BASE_NAME, "prompt": "hi", "max_tokens": 2, "n": 16}
    with TestClient(create_app(deps)) as client:
        headers = _tenant_token(client, f"trickle-{secrets.token_hex(4)}", 0.001)
        refused = client.post("/v1/completions", json=body, headers=headers)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == "n"
        again = client.post("/v1/completions", json={**body, "n": 1}, headers=headers)
        assert int(again.headers["Retry-After"]) == 1000  # only the arrival was charged
        widest = _tenant_token(client, f"trickle-{secrets.token_hex(4)}", 0.001)
        assert client.post("/v1/completions", json={**body, "n": 3}, headers=widest).is_success
        owed = client.post("/v1/completions", json={**body, "n": 1}, headers=widest)
        assert owed.status_code == 429
        assert int(owed.headers["Retry-After"]) == 3000
    assert deps.cache is not None
    deps.cache.close()
