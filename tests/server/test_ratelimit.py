"""The ``max_requests_per_s`` quota: a token bucket per tenant (429 with Retry-After)."""

from __future__ import annotations

import pytest
from conftest import BASE_NAME, Rig

from loraplex.errors import RateLimitError
from loraplex.quota.ratelimit import MAX_WAIT_S, RateLimiter
from loraplex.registry import PriorityClass, Tenant, TenantQuotas
from loraplex.server.errors import MAX_RETRY_AFTER_S, ErrorContext, to_api_error
from loraplex.server.limits import max_engine_requests


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _tenant(name: str, rate: float | None) -> Tenant:
    quotas = TenantQuotas(max_requests_per_s=rate)
    return Tenant(name, PriorityClass.NORMAL, quotas, 0.0)


def test_bucket_allows_the_rate_and_a_burst_then_refuses_with_retry_after() -> None:
    clock = Clock()
    limiter = RateLimiter(burst_s=1.0, clock=clock)
    tenant = _tenant("acme", 4.0)
    for _ in range(4):  # a full bucket: one second of the rate
        limiter.check(tenant)
    with pytest.raises(RateLimitError) as refused:
        limiter.check(tenant)
    assert refused.value.retry_after_s == pytest.approx(0.25)
    error = to_api_error(refused.value, ErrorContext.TENANT)
    assert (error.status, error.code, error.headers["Retry-After"]) == (429, "rate_limited", "1")
    clock.now = 0.25  # one token back
    limiter.check(tenant)
    with pytest.raises(RateLimitError):
        limiter.check(tenant)


def test_tenants_have_their_own_buckets_and_no_quota_means_no_limit() -> None:
    limiter = RateLimiter(clock=Clock())
    slow, other, free = _tenant("slow", 0.5), _tenant("other", 1.0), _tenant("free", None)
    limiter.check(slow)  # a rate below 1/s still holds one request
    with pytest.raises(RateLimitError):
        limiter.check(slow)
    limiter.check(other)
    for _ in range(1000):
        limiter.check(free)


def test_a_quota_change_applies_at_once() -> None:
    clock = Clock()
    limiter = RateLimiter(clock=clock)
    limiter.check(_tenant("acme", 1.0))
    with pytest.raises(RateLimitError):
        limiter.check(_tenant("acme", 1.0))
    clock.now = 0.1
    limiter.check(_tenant("acme", 100.0))  # refills at the new rate


def test_over_http_a_tenant_over_its_rate_gets_429_before_its_body_is_read(rig: Rig) -> None:
    admin = rig.client
    assert admin.post("/admin/tenants", json={"name": "bursty"}, headers=rig.admin).status_code in (
        200,
        201,
    )
    quotas = {"quotas": {"max_requests_per_s": 0.01}}  # one request, then one every 100 s
    assert admin.put("/admin/tenants/bursty", json=quotas, headers=rig.admin).status_code == 200
    token = admin.post("/admin/tenants/bursty/keys", headers=rig.admin).json()["token"]
    headers = {"Authorization": f"Bearer {token}"}
    body = {"model": BASE_NAME, "prompt": "hi", "max_tokens": 2}
    assert admin.post("/v1/completions", json=body, headers=headers).status_code == 200
    refused = admin.post("/v1/completions", content=b"{not json", headers=headers)
    assert refused.status_code == 429  # refused before the (broken) body was parsed
    assert refused.json()["error"]["code"] == "rate_limited"
    assert int(refused.headers["Retry-After"]) >= 99
    calm = admin.post(
        "/v1/completions", json={**body, "model": "support"}, headers=rig.headers("acme")
    )
    assert calm.status_code == 200  # another tenant's bucket is its own


def test_a_costlier_check_takes_that_many_tokens_and_a_full_bucket_lets_any_cost_in() -> None:
    """A cost above the bucket's capacity passes on a full bucket (it could never pass
    otherwise) and is then taken whole: the bucket owes the rest, paid back by its refill
    before anything else passes. Before, it took only the capacity: with a rate of 4, a cost
    of 100 a second passed, 25 times the rate."""
    clock = Clock()
    limiter = RateLimiter(burst_s=1.0, clock=clock)
    tenant = _tenant("acme", 4.0)
    limiter.check(tenant, 3)
    with pytest.raises(RateLimitError) as refused:
        limiter.check(tenant, 2)  # one token left
    assert refused.value.retry_after_s == pytest.approx(0.25)
    clock.now = 10.0
    limiter.check(tenant, 100)  # above the capacity: let in on a full bucket, owing 96
    clock.now = 11.0  # a full bucket's refill later: still owing 92
    with pytest.raises(RateLimitError) as owing:
        limiter.check(tenant)
    assert owing.value.retry_after_s == pytest.approx(23.25)  # (1 + 92) / 4
    with pytest.raises(RateLimitError):
        limiter.check(tenant, 100)  # nor does another large cost pass in debt
    clock.now = 34.25
    limiter.check(tenant)
    with pytest.raises(ValueError, match="cost"):
        limiter.check(tenant, 0)


def _limited(rig: Rig, name: str, rate: float) -> dict[str, str]:
    """Headers of a new tenant ``name`` whose quota is ``rate`` requests a second."""
    admin = rig.client
    admin.post("/admin/tenants", json={"name": name}, headers=rig.admin)
    quotas = {"quotas": {"max_requests_per_s": rate}}
    assert admin.put(f"/admin/tenants/{name}", json=quotas, headers=rig.admin).status_code == 200
    token = admin.post(f"/admin/tenants/{name}/keys", headers=rig.admin).json()["token"]
    return {"Authorization": f"Bearer {token}"}


def test_over_http_n_choices_count_as_n_requests_against_the_rate(rig: Rig) -> None:
    headers = _limited(rig, "fanner", 3.0)  # a bucket of 3 requests
    body = {"model": BASE_NAME, "prompt": "hi", "max_tokens": 2, "n": 3}
    assert rig.client.post("/v1/completions", json=body, headers=headers).status_code == 200
    refused = rig.client.post("/v1/completions", json=body, headers=headers)
    assert refused.status_code == 429  # the first three choices used the whole bucket
    assert refused.json()["error"]["code"] == "rate_limited"


def test_over_http_a_fan_out_above_the_bucket_passes_on_a_full_bucket(rig: Rig) -> None:
    """A request costing more than the bucket holds passes on a full bucket, as a single
    check's cost does; the arrival's token must not leave the rest forever one short (n=4 on a
    bucket of 2 was refused with ``Retry-After: 1`` however long the tenant waited)."""
    headers = _limited(rig, "wide", 2.0)  # a bucket of 2 requests
    body = {"model": BASE_NAME, "prompt": "hi", "max_tokens": 2, "n": 4}
    passed = rig.client.post("/v1/completions", json=body, headers=headers)
    assert passed.status_code == 200, passed.text
    assert len(passed.json()["choices"]) == 4
    refused = rig.client.post("/v1/completions", json={**body, "n": 1}, headers=headers)
    assert refused.status_code == 429  # it took the whole bucket and owes two requests
    assert int(refused.headers["Retry-After"]) >= 1


def test_over_http_a_fan_out_cannot_multiply_the_rate(rig: Rig) -> None:
    """A fan-out above the bucket passes on a full bucket and then owes the rest: with a bucket
    of one request, ``n=4`` is four requests' worth of waiting. Before, the arrival took the only
    token and the other three were free (``n=16`` once a second on a rate of 1 was 16 engine
    requests a second), and on a larger bucket the rest was capped at the bucket."""
    headers = _limited(rig, "fanout", 1.0)  # a bucket of 1 request
    body = {"model": BASE_NAME, "prompt": "hi", "max_tokens": 2, "n": 4}
    passed = rig.client.post("/v1/completions", json=body, headers=headers)
    assert passed.status_code == 200, passed.text
    refused = rig.client.post("/v1/completions", json={**body, "n": 1}, headers=headers)
    assert refused.status_code == 429
    assert int(refused.headers["Retry-After"]) >= 3  # three requests owed at one a second


def test_the_largest_fan_out_is_what_the_longest_retry_after_repays() -> None:
    assert max_engine_requests(0.001, 1.0) == 3  # a bucket of 1 and 3.6 requests an hour
    assert max_engine_requests(1.0, 1.0) == 3600
    assert max_engine_requests(10.0, 2.0) == 19 + 36_000


def test_over_http_a_fan_out_no_retry_after_could_repay_is_refused_before_its_cost(
    rig: Rig,
) -> None:
    """``n=16`` at 0.001 requests a second would owe about 15,000 s while Retry-After says an
    hour at most: the client retried after the hour and got 429 again. Now it is a 400 naming
    ``n`` and the rate, and only its arrival was charged (the next request waits 1,000 s, not the
    fan-out's debt); the largest fan-out that passes leaves an honest Retry-After."""
    headers = _limited(rig, "trickle", 0.001)
    body = {"model": BASE_NAME, "prompt": "hi", "max_tokens": 2, "n": 16}
    refused = rig.client.post("/v1/completions", json=body, headers=headers)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "n"
    assert "16 engine requests" in error["message"] and "0.001" in error["message"]
    assert "at most 3" in error["message"]
    again = rig.client.post("/v1/completions", json={**body, "n": 1}, headers=headers)
    assert again.status_code == 429
    assert int(again.headers["Retry-After"]) == 1000  # the arrival's token, no fan-out debt
    batch = {"model": BASE_NAME, "prompt": ["a", "b"], "max_tokens": 2, "n": 2}
    batched = rig.client.post("/v1/completions", json=batch, headers=_limited(rig, "tb", 0.001))
    assert batched.status_code == 400 and batched.json()["error"]["param"] == "prompt"
    widest = _limited(rig, "trickle-wide", 0.001)
    passed = rig.client.post("/v1/completions", json={**body, "n": 3}, headers=widest)
    assert passed.status_code == 200, passed.text
    owed = rig.client.post("/v1/completions", json={**body, "n": 1}, headers=widest)
    assert owed.status_code == 429
    assert int(owed.headers["Retry-After"]) == 3000  # honest: under the one-hour cap


def test_over_http_a_bad_session_header_is_refused_before_the_fan_out_is_charged(
    rig: Rig,
) -> None:
    """At 0.01 requests a second (a bucket of one), ``n`` 3 with a bad header: only the
    arrival was charged, so the next request waits 100 s, not the 300 s the fan-out owes."""
    headers = _limited(rig, "sessions", 0.01)
    body = {"model": BASE_NAME, "prompt": "hi", "max_tokens": 2, "n": 3, "user": "ana"}
    bad = rig.client.post("/v1/completions", json=body, headers={**headers, "X-Session-Id": ""})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "X-Session-Id"
    again = rig.client.post("/v1/completions", json=body, headers=headers)
    assert again.status_code == 429 and int(again.headers["Retry-After"]) == 100


def test_a_quota_lowered_while_in_debt_leaves_at_most_the_longest_retry_after() -> None:
    """A fan-out's debt is bounded by what its rate repays within the longest Retry-After
    (``max_engine_requests``), but at the rate of its arrival: the operator then lowering the
    quota (1 to 0.001 a second) after an ``n`` 16 left 15 requests owed at 0.001 a second,
    16,000 s, while every 429 said Retry-After 3600, so the client came back after the hour and
    was refused again, for 4.4 hours. Now the bucket owes at most what its current rate repays
    in that hour."""
    clock = Clock()
    limiter = RateLimiter(burst_s=1.0, clock=clock)
    limiter.check(_tenant("acme", 1.0), 16)  # n=16 on a full bucket of 1: owing 15
    lowered = _tenant("acme", 0.001)
    with pytest.raises(RateLimitError) as owing:
        limiter.check(lowered)
    assert owing.value.retry_after_s == pytest.approx(MAX_RETRY_AFTER_S)
    clock.now = float(MAX_RETRY_AFTER_S)
    limiter.check(lowered)  # the Retry-After was the truth
    with pytest.raises(RateLimitError) as again:
        limiter.check(lowered)
    assert again.value.retry_after_s == pytest.approx(1000.0)  # the new rate, no old debt


def test_a_debt_the_current_rate_repays_within_the_hour_is_kept_whole() -> None:
    """The bound forgives nothing a fan-out admitted at the current rate owes."""
    clock = Clock()
    limiter = RateLimiter(burst_s=1.0, clock=clock)
    tenant = _tenant("acme", 0.001)
    most = max_engine_requests(0.001, 1.0)
    limiter.check(tenant, most)
    with pytest.raises(RateLimitError) as owing:
        limiter.check(tenant)
    assert owing.value.retry_after_s == pytest.approx(most * 1000.0)
    assert most * 1000.0 <= MAX_RETRY_AFTER_S
    assert MAX_WAIT_S == MAX_RETRY_AFTER_S  # the bound is the longest Retry-After


def _retry_after(refused: pytest.ExceptionInfo[RateLimitError]) -> int:
    return int(to_api_error(refused.value, ErrorContext.TENANT).headers["Retry-After"])


def _refused_after_one(gap_s: float) -> tuple[Clock, RateLimiter, Tenant, int]:
    """A limiter at one request per ``gap_s`` whose tenant's second request was just refused
    at time 0, with that refusal's Retry-After."""
    clock = Clock()
    limiter = RateLimiter(burst_s=1.0, clock=clock)
    tenant = _tenant("acme", 1 / gap_s)
    limiter.check(tenant)
    with pytest.raises(RateLimitError) as refused:
        limiter.check(tenant)
    return clock, limiter, tenant, _retry_after(refused)


@pytest.mark.parametrize("gap_s", [7200, 86_400])
def test_a_rate_below_one_an_hour_says_its_whole_gap(gap_s: int) -> None:
    """Below one request per ``MAX_WAIT_S`` the wait is the rate's own gap: every Retry-After
    was capped at 3600, so at one request per 2 h the client came back after the hour and was
    refused again."""
    clock, limiter, tenant, retry_after = _refused_after_one(gap_s)
    assert retry_after == gap_s
    clock.now = gap_s - 1.0
    with pytest.raises(RateLimitError):
        limiter.check(tenant)
    clock.now = float(gap_s)
    limiter.check(tenant)  # the Retry-After was the truth


def test_an_absurd_rate_says_at_most_the_longest_delta_seconds() -> None:
    """One request per 10^300 s: the header is RFC 9111's largest delta-seconds, not 301 digits."""
    assert _refused_after_one(1e300)[3] == 2**31


@pytest.mark.parametrize("gap_s", [161, 187, 322, 347])
def test_coming_back_after_exactly_the_retry_after_passes(gap_s: int) -> None:
    """At 1/161 a second the wait computes to exactly 161.0 s, but 161 s refill 161 * (1/161) =
    0.99999999999998 tokens: the client coming back after exactly its Retry-After was refused
    again (with Retry-After 1). A shortfall of float rounding passes now."""
    clock, limiter, tenant, retry_after = _refused_after_one(gap_s)
    assert retry_after == gap_s
    clock.now = float(retry_after)
    limiter.check(tenant)


def test_over_http_a_rate_below_one_an_hour_says_its_whole_gap(rig: Rig) -> None:
    headers = _limited(rig, "hourly", 1 / 7200)
    body = {"model": BASE_NAME, "prompt": "hi", "max_tokens": 2}
    assert rig.client.post("/v1/completions", json=body, headers=headers).status_code == 200
    refused = rig.client.post("/v1/completions", json=body, headers=headers)
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "7200"
