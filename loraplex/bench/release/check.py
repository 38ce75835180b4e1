"""The checks and figures of ``loraplex bench release``, computed from recorded answers only.

Pure functions over ``Answer`` and ``CycleOutcome`` records, so a test can feed them records
with a known defect (an answer whose text belongs to another revision) and see it counted.
Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from loraplex.bench.harness.stats import nearest_rank
from loraplex.bench.harness.stats import ratio as harness_ratio

BASELINE = "baseline"  # phase kind: no release running
RELEASING = "releasing"  # phase kind: release cycles running back to back
PROMOTED = "promoted"
ROLLED_BACK = "rolled_back"


@dataclass(frozen=True)
class Answer:
    """One steady-traffic request and what came back."""

    t_s: float  # arrival, seconds from the start of the traffic
    phase: str  # phase name at arrival ("A1", "B1", ...)
    phase_kind: str  # BASELINE or RELEASING
    tenant: str  # requesting tenant
    adapter: str  # adapter name (the alias; never pinned)
    user: str  # the request's ``user`` field (what keeps it on one side of a canary)
    status: int  # HTTP status; 0: no response (timeout or transport error)
    ttft_s: float | None  # arrival to first text; None without one
    revision: str | None  # ``loraplex.revision`` of the chunks (tenant/name@revision)
    header_revision: str | None  # the ``x-loraplex-revision`` header
    text: str  # the streamed completion text
    request_id: str | None  # the response id (what feedback rates)
    error: str | None  # error type or body; None on success

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


@dataclass(frozen=True)
class CycleOutcome:
    """How one release cycle ended."""

    index: int  # position in the run
    adapter: str  # tenant/name released
    candidate: str  # tenant/name@label
    kind: str  # CycleKind value
    files_from: str  # demo revision whose files the candidate has
    probe_from: str  # demo revision whose continuation was registered as its probe
    state: str  # final release state (promoted, rolled_back, aborted, timeout)
    reason: str | None  # the release's reason, as the admin API reported it
    duration_s: float  # start request to the terminal state observed
    canary_users: int  # distinct users whose answers reported the candidate
    rollback_to_old_ms: float | None  # see ``docs/benchmarks/release.md``; None: not measured


def wrong_revision(answer: Answer, truth: dict[str, str]) -> bool:
    """A completed answer whose text is not the continuation of the revision it reports (or
    whose header and body disagree, or which reports a revision the bench never registered)."""
    if not answer.ok:
        return False
    reported = answer.revision
    if reported is None or reported != answer.header_revision or reported not in truth:
        return True
    return answer.text != truth[reported]


def phase_figures(answers: Iterable[Answer], timeout_s: float) -> dict[str, object]:
    """TTFT of one phase kind; a failed or timed-out request counts at ``timeout_s`` (a run
    that fails its requests must not look fast)."""
    chosen = list(answers)
    ttfts = [a.ttft_s if a.ok and a.ttft_s is not None else timeout_s for a in chosen]
    completed = sum(1 for a in chosen if a.ok)
    p50, p99 = nearest_rank(ttfts, 0.5), nearest_rank(ttfts, 0.99)
    return {
        "requests": len(chosen),
        "completed": completed,
        "completed_ratio": round(completed / len(chosen), 4) if chosen else None,
        "ttft_p50_ms": None if p50 is None else round(p50 * 1000, 2),
        "ttft_p99_ms": None if p99 is None else round(p99 * 1000, 2),
    }


def ratio(numerator: object, denominator: object) -> float | None:
    """None (null) when either side is unknown or the denominator is not > 0; never 0.0."""
    if not isinstance(numerator, int | float) or not isinstance(denominator, int | float):
        return None
    return harness_ratio(numerator, denominator)


def release_metrics(
    answers: Sequence[Answer],
    outcomes: Sequence[CycleOutcome],
    truth: dict[str, str],
    timeout_s: float,
) -> dict[str, object]:
    """The headline figures (see ``docs/benchmarks/release.md`` for each definition)."""
    baseline = phase_figures((a for a in answers if a.phase_kind == BASELINE), timeout_s)
    releasing = phase_figures((a for a in answers if a.phase_kind == RELEASING), timeout_s)
    rollbacks = [o.rollback_to_old_ms for o in outcomes if o.rollback_to_old_ms is not None]
    p99_rollback = nearest_rank(rollbacks, 0.99)
    bad = [o for o in outcomes if o.kind != "good"]
    probe_failed = {o.candidate for o in outcomes if o.kind == "probe_fail"}
    return {
        "wrong_revision_answers": sum(1 for a in answers if wrong_revision(a, truth)),
        # A candidate whose probe fails must never reach tenant traffic.
        "probe_failed_candidate_answers": sum(
            1 for a in answers if a.ok and a.revision in probe_failed
        ),
        "bad_releases_promoted": sum(1 for o in bad if o.state == PROMOTED),
        "good_releases_promoted": sum(
            1 for o in outcomes if o.kind == "good" and o.state == PROMOTED
        ),
        "good_releases": len(outcomes) - len(bad),
        "bad_releases_rolled_back": sum(1 for o in bad if o.state == ROLLED_BACK),
        "bad_releases": len(bad),
        "rollback_to_first_old_answer_ms": (
            None if p99_rollback is None else round(p99_rollback, 2)
        ),
        "rollbacks_timed": len(rollbacks),
        "release_p99_ttft_ratio": ratio(releasing["ttft_p99_ms"], baseline["ttft_p99_ms"]),
        "completed_ratio_baseline": baseline["completed_ratio"],
        "completed_ratio_releasing": releasing["completed_ratio"],
        "failed_requests": sum(1 for a in answers if not a.ok),
        "phases": {BASELINE: baseline, RELEASING: releasing},
    }


def statuses(answers: Iterable[Answer]) -> dict[str, int]:
    """HTTP status -> count (0: no response)."""
    counts: dict[str, int] = {}
    for answer in answers:
        counts[str(answer.status)] = counts.get(str(answer.status), 0) + 1
    return dict(sorted(counts.items()))
