"""compare.breaches / judge on constructed windows: latency needs samples on both sides, and
error / feedback checks leave the worst caller out."""

from __future__ import annotations

from loraplex.release.compare import breaches, judge
from loraplex.release.model import RevisionWindow, Thresholds

LIMITS = Thresholds(min_requests=10, min_latency_samples=50)


def _latency(samples: int, p99_s: float) -> RevisionWindow:
    return RevisionWindow(
        requests=samples,
        ttft_p99_s=p99_s,
        tpot_p99_s=p99_s / 10,
        ttft_samples=samples,
        tpot_samples=samples,
        ttft_p99_judged_s=p99_s,
        tpot_p99_judged_s=p99_s / 10,
        ttft_judged_samples=samples,
        tpot_judged_samples=samples,
    )


def test_latency_is_not_judged_below_min_latency_samples() -> None:
    # The incident: 27 candidate vs 13 stable samples, P99 = the single slowest request.
    assert breaches(_latency(27, 0.547), _latency(13, 0.1), LIMITS) == []
    assert breaches(_latency(200, 0.547), _latency(49, 0.1), LIMITS) == []
    found = breaches(_latency(50, 0.547), _latency(50, 0.1), LIMITS)
    assert found == [
        "ttft_p99 547.0 ms is 5.47x stable's (max 3x)",
        "tpot_p99 54.7 ms is 5.47x stable's (max 3x)",
    ]


def test_each_latency_metric_needs_its_own_samples() -> None:
    candidate = RevisionWindow(
        requests=60,
        ttft_p99_judged_s=1.0,
        tpot_p99_judged_s=1.0,
        ttft_judged_samples=60,
        tpot_judged_samples=5,
    )
    stable = RevisionWindow(
        requests=60,
        ttft_p99_judged_s=0.1,
        tpot_p99_judged_s=0.1,
        ttft_judged_samples=60,
        tpot_judged_samples=60,
    )
    assert [b.split()[0] for b in breaches(candidate, stable, LIMITS)] == ["ttft_p99"]


def test_feedback_of_one_caller_alone_is_not_a_breach() -> None:
    one_rater = RevisionWindow(requests=20, good=2, bad=12, top_rater_good=0, top_rater_bad=12)
    assert breaches(one_rater, RevisionWindow(), LIMITS) == []
    many = RevisionWindow(requests=20, good=2, bad=12, top_rater_good=0, top_rater_bad=2)
    assert breaches(many, RevisionWindow(), LIMITS) == [
        "bad feedback 10/12 > max_bad_feedback_ratio 0.25"
    ]


def test_a_lone_failing_caller_is_no_evidence_to_pass() -> None:
    lone = RevisionWindow(requests=30, errors=30, callers=1, top_caller_requests=30,
                          top_caller_errors=30)  # fmt: skip
    judged = judge(0, 1.0, lone, RevisionWindow(), limits=LIMITS, dwelt=True)
    assert (judged.breaches, judged.passed) == ((), False)


def test_stable_is_judged_without_its_worst_caller_too() -> None:
    candidate = RevisionWindow(requests=100, errors=4)
    stable = RevisionWindow(
        requests=100, errors=10, top_caller_requests=10, top_caller_errors=10
    )  # without its worst caller, stable fails 0 / 90
    found = breaches(candidate, stable, LIMITS)
    assert found == [
        "error rate 0.040 exceeds stable's 0.000 by more than max_error_rate_over_stable 0.02"
    ]
