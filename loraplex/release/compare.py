"""Judging a canary step: the candidate's live traffic against the stable revision's.

A breach needs evidence: nothing is judged before the candidate has ``min_requests`` finished
requests in the step. Ratios against the stable revision are judged only where the stable side
has a figure (no stable traffic in the step: only the absolute limits apply).
"""

from __future__ import annotations

from loraplex.release.model import Comparison, RevisionWindow, Thresholds


def breaches(candidate: RevisionWindow, stable: RevisionWindow, limits: Thresholds) -> list[str]:
    """Each threshold the candidate crosses, worded for an operator; empty when none (or when
    there is not yet enough candidate traffic to say)."""
    if candidate.requests < limits.min_requests:
        return []
    found = []
    rate = candidate.error_rate or 0.0
    if rate > limits.max_error_rate:
        found.append(f"error rate {rate:.3f} > max_error_rate {limits.max_error_rate:g}")
    stable_rate = stable.error_rate
    if stable_rate is not None and rate - stable_rate > limits.max_error_rate_over_stable:
        found.append(
            f"error rate {rate:.3f} exceeds stable's {stable_rate:.3f} by more than "
            f"max_error_rate_over_stable {limits.max_error_rate_over_stable:g}"
        )
    found += _ratio("ttft_p99", candidate.ttft_p99_s, stable.ttft_p99_s, limits.max_ttft_p99_ratio)
    found += _ratio("tpot_p99", candidate.tpot_p99_s, stable.tpot_p99_s, limits.max_tpot_p99_ratio)
    rated = candidate.good + candidate.bad
    if rated > 0 and candidate.bad / rated > limits.max_bad_feedback_ratio:
        found.append(
            f"bad feedback {candidate.bad}/{rated} > max_bad_feedback_ratio "
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
    requests and no breach."""
    found = tuple(breaches(candidate, stable, limits))
    enough = candidate.requests >= limits.min_requests
    return Comparison(step, at, candidate, stable, found, dwelt and enough and not found)


def _ratio(what: str, mine: float | None, theirs: float | None, limit: float) -> list[str]:
    if mine is None or theirs is None or theirs <= 0.0:
        return []
    ratio = mine / theirs
    if ratio <= limit:
        return []
    return [f"{what} {mine * 1000:.1f} ms is {ratio:.2f}x stable's (max {limit:g}x)"]
