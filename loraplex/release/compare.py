"""Judging a canary step: the candidate's live traffic against the stable revision's.

A breach needs evidence, and never one caller's alone:

- nothing is judged before the candidate has ``min_requests`` finished requests in the step
  not counting the caller that failed most nor the one that succeeded most
  (``RevisionWindow.without_top_callers``): one tenant's flood is no evidence;
- error rates and the bad-feedback ratio are judged without the caller that failed most and the
  one that rated worst, and without the one that succeeded most and the one that rated best (on
  both sides), so one tenant cannot roll a release back by failing or rating its own requests,
  nor hide the failures others see behind its successes; two callers seeing the same failures
  still can roll it back;
- a P99 latency ratio is judged on each side without the caller whose absence lowers that P99
  most and the one whose absence raises it most (``release/callers.py``): one tenant's long
  prompts on the candidate, or its flood of short ones on either side, decide nothing;
- a latency ratio is judged only when both sides have ``min_latency_samples`` samples of it
  besides those callers' (below ~100 the nearest-rank P99 is the single slowest request);
- ratios against the stable revision are judged only where the stable side has a figure (no
  stable traffic in the step: only the absolute limits apply).
"""

from __future__ import annotations

from loraplex.release.model import Comparison, RevisionWindow, Thresholds

NOT_ENOUGH_TRAFFIC = "not enough traffic to judge"  # the start of a timed-out step's reason


def breaches(candidate: RevisionWindow, stable: RevisionWindow, limits: Thresholds) -> list[str]:
    """Each threshold the candidate crosses, worded for an operator; empty when none (or when
    there is not yet enough candidate traffic to say)."""
    mine, theirs = candidate.without_top_callers(), stable.without_top_callers()
    if mine.requests < limits.min_requests:
        return []
    found = []
    rate = mine.error_rate or 0.0
    if rate > limits.max_error_rate:
        found.append(f"error rate {rate:.3f} > max_error_rate {limits.max_error_rate:g}")
    stable_rate = theirs.error_rate
    if stable_rate is not None and rate - stable_rate > limits.max_error_rate_over_stable:
        found.append(
            f"error rate {rate:.3f} exceeds stable's {stable_rate:.3f} by more than "
            f"max_error_rate_over_stable {limits.max_error_rate_over_stable:g}"
        )
    found += _latency(candidate, stable, limits)
    rated = mine.good + mine.bad
    if rated > 0 and mine.bad / rated > limits.max_bad_feedback_ratio:
        found.append(
            f"bad feedback {mine.bad}/{rated} > max_bad_feedback_ratio "
            f"{limits.max_bad_feedback_ratio:g}"
        )
    return found


def judge(
    step: int,
    at: float,
    candidate: RevisionWindow,
    stable: RevisionWindow,
    *,
    limits: Thresholds,
    dwelt: bool,
) -> Comparison:
    """The step's comparison; ``passed`` once it has dwelt long enough, with enough candidate
    requests (besides the caller that failed most) and no breach."""
    found = tuple(breaches(candidate, stable, limits))
    enough = has_evidence(candidate, limits)
    return Comparison(step, at, candidate, stable, found, dwelt and enough and not found)


def has_evidence(candidate: RevisionWindow, limits: Thresholds) -> bool:
    """Whether the step has the candidate requests it needs to pass."""
    return candidate.without_top_callers().requests >= limits.min_requests


def _latency(candidate: RevisionWindow, stable: RevisionWindow, limits: Thresholds) -> list[str]:
    least = limits.min_latency_samples
    found = []
    if min(candidate.ttft_judged_samples, stable.ttft_judged_samples) >= least:
        found += _ratio(
            "ttft_p99",
            candidate.ttft_p99_judged_s,
            stable.ttft_p99_judged_s,
            limits.max_ttft_p99_ratio,
        )
    if min(candidate.tpot_judged_samples, stable.tpot_judged_samples) >= least:
        found += _ratio(
            "tpot_p99",
            candidate.tpot_p99_judged_s,
            stable.tpot_p99_judged_s,
            limits.max_tpot_p99_ratio,
        )
    return found


def _ratio(what: str, mine: float | None, theirs: float | None, limit: float) -> list[str]:
    if mine is None or theirs is None or theirs <= 0.0:
        return []
    ratio = mine / theirs
    if ratio <= limit:
        return []
    return [f"{what} {mine * 1000:.1f} ms is {ratio:.2f}x stable's (max {limit:g}x)"]
