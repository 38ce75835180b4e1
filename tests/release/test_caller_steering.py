"""A tenant calling another tenant's public adapter during its canary must not decide the
release alone, in either direction: its slow or failed requests must not roll a good candidate
back, and its fast, successful or praised requests must not hide a bad candidate's failures
from the owner's own callers (nor be the evidence that lets a step pass).

Each window is built by ``ReleaseTraffic`` from recorded requests, as the server records them
(``caller_key``: every request of another tenant is one caller, ``tenant:acme``)."""

from __future__ import annotations

from loraplex.clock import ManualClock
from loraplex.release.compare import judge
from loraplex.release.model import Comparison, Thresholds
from loraplex.release.traffic import (
    BASELINE,
    CANDIDATE,
    ReleaseTraffic,
    TrackedRevision,
    Verdict,
)

CAND = "globex/search@r2"
BASE = "globex/search@r1"
ATTACKER = "tenant:acme"  # another tenant: one caller whatever users or sessions it names
LIMITS = Thresholds(min_requests=10, min_latency_samples=50)


def _traffic() -> ReleaseTraffic:
    traffic = ReleaseTraffic(ManualClock(1.0), tuple)
    traffic.set_tracked(
        [
            TrackedRevision(CAND, "rel-1", CANDIDATE, "canary"),
            TrackedRevision(BASE, "rel-1", BASELINE, "canary"),
        ]
    )
    return traffic


def _owner_users(traffic: ReleaseTraffic, ref: str, count: int, ttft_s: float) -> None:
    for i in range(count):
        traffic.record(ref, Verdict.OK, ttft_s, ttft_s / 10, f"owner:user-{i}")


def _judged(traffic: ReleaseTraffic) -> Comparison:
    candidate, stable = traffic.window(CAND, 0.0), traffic.window(BASE, 0.0)
    return judge(0, 2.0, candidate, stable, limits=LIMITS, dwelt=True)


def test_one_tenants_slow_requests_do_not_roll_a_good_candidate_back() -> None:
    traffic = _traffic()
    _owner_users(traffic, CAND, 60, 0.1)
    _owner_users(traffic, BASE, 60, 0.1)
    for _ in range(5):  # long prompts, sent only on the users its own answers showed on r2
        traffic.record(CAND, Verdict.OK, 2.0, 0.2, ATTACKER)
    judged = _judged(traffic)
    assert judged.breaches == ()
    assert judged.passed


def test_one_tenants_fast_requests_on_stable_do_not_roll_a_good_candidate_back() -> None:
    traffic = _traffic()
    for i in range(60):  # the owner's users see the same spread on both revisions
        ttft_s = 0.1 + 0.01 * i
        traffic.record(CAND, Verdict.OK, ttft_s, ttft_s / 10, f"owner:user-{i}")
        traffic.record(BASE, Verdict.OK, ttft_s, ttft_s / 10, f"owner:user-{i}")
    for _ in range(20_000 - 60):  # a flood of one-token prompts on the stable side
        traffic.record(BASE, Verdict.OK, 0.01, 0.001, ATTACKER)
    judged = _judged(traffic)
    assert judged.breaches == ()
    assert judged.passed


def test_one_tenants_successes_do_not_hide_a_failing_candidate() -> None:
    traffic = _traffic()
    for i in range(20):  # 8 of the owner's 20 users fail on the candidate
        verdict = Verdict.ERROR if i < 8 else Verdict.OK
        traffic.record(CAND, verdict, None if i < 8 else 0.1, None, f"owner:user-{i}")
    for _ in range(1_000):
        traffic.record(CAND, Verdict.OK, 0.1, 0.01, ATTACKER)
    judged = _judged(traffic)
    assert not judged.passed
    assert judged.breaches and judged.breaches[0].startswith("error rate 0.368 > max_error_rate")


def test_one_tenants_fast_requests_do_not_hide_a_slow_candidate() -> None:
    traffic = _traffic()
    _owner_users(traffic, CAND, 60, 1.0)  # 10x slower than stable for every owner user
    _owner_users(traffic, BASE, 60, 0.1)
    for _ in range(10_000):
        traffic.record(CAND, Verdict.OK, 0.01, 0.001, ATTACKER)
    judged = _judged(traffic)
    assert not judged.passed
    assert any(found.startswith("ttft_p99 1000.0 ms is 10.00x") for found in judged.breaches)


def test_one_tenants_praise_does_not_hide_bad_feedback() -> None:
    traffic = _traffic()
    _owner_users(traffic, CAND, 20, 0.1)
    for i in range(10):  # half of the owner's users rate their answer bad
        traffic.record_feedback(CAND, 1.0, good=False, caller=f"owner:user-{i}")
    for _ in range(100):
        traffic.record(CAND, Verdict.OK, 0.1, 0.01, ATTACKER)
        traffic.record_feedback(CAND, 1.0, good=True, caller=ATTACKER)
    judged = _judged(traffic)
    assert not judged.passed
    assert "bad feedback 9/9 > max_bad_feedback_ratio 0.25" in judged.breaches


def test_one_tenants_requests_alone_are_no_evidence_to_pass() -> None:
    traffic = _traffic()
    for _ in range(1_000):
        traffic.record(CAND, Verdict.OK, 0.1, 0.01, ATTACKER)
    judged = _judged(traffic)
    assert (judged.breaches, judged.passed) == ((), False)
