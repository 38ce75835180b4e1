"""What a release is: its states, the operator's plan, the thresholds it is judged by (torch-free).

    staged ──▶ prewarming ──▶ probing ──▶ canary(step 0..n-1) ──▶ promoted
      │            │             │            │
      └────────────┴─────────────┴────────────┴──▶ aborted | rolled_back

``staged``: written by ``release start``; the controller picks it up. ``prewarming``: the
candidate is loaded into CPU memory (L1; and GPU slots with ``gpu``) while the stable revision
stays resident. ``probing``: greedy output probes must pass; no tenant traffic reaches the
candidate before they do. ``canary``: a sticky share (``plan.ladder[step]``) of the alias's
callers gets the candidate; each step lasts at least ``plan.dwell_s`` and is compared against
the stable revision over the step. ``promoted``: the alias points at the candidate; the old
stable revision stays pinned in L1 until ``hold_until`` (delayed eviction). ``rolled_back``:
a probe or threshold failed, or an operator said so; all traffic is on the stable revision.
``aborted``: stopped before canary traffic, or the release could not go on (e.g. the candidate
failed to load).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class ReleaseState(StrEnum):
    STAGED = "staged"
    PREWARMING = "prewarming"
    PROBING = "probing"
    CANARY = "canary"
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"
    ABORTED = "aborted"


TERMINAL_STATES = frozenset({ReleaseState.PROMOTED, ReleaseState.ROLLED_BACK, ReleaseState.ABORTED})


@dataclass(frozen=True)
class Thresholds:
    """When a canary step fails (any one breach rolls the release back). Ratios compare the
    candidate's figure over the step with the stable revision's over the same step."""

    max_error_rate: float = 0.05  # candidate's failed / finished requests
    max_error_rate_over_stable: float = 0.02  # candidate's error rate minus stable's
    max_ttft_p99_ratio: float = 3.0  # candidate P99 TTFT / stable P99 TTFT
    max_tpot_p99_ratio: float = 3.0  # candidate P99 TPOT / stable P99 TPOT
    max_bad_feedback_ratio: float = 0.25  # bad / (good + bad) client feedback on the candidate
    min_requests: int = 10  # candidate requests a step needs before it can pass


@dataclass(frozen=True)
class ProbeCase:
    """One output probe, run greedily on the candidate before any traffic reaches it."""

    prompt: str  # sent as a completion prompt
    expected: str | None = None  # the greedy continuation must start with this
    differ_from_stable: bool = False  # the candidate's continuation must differ from stable's
    max_tokens: int = 16  # tokens generated for the probe


@dataclass(frozen=True)
class ReleasePlan:
    """What the operator asked for (``release start`` flags)."""

    ladder: tuple[float, ...] = (0.01, 0.05, 0.25)  # canary shares in (0, 1], increasing
    dwell_s: float = 60.0  # minimum seconds per ladder step
    window_s: float = 600.0  # the old stable revision stays pinned this long after promotion
    gpu: bool = False  # prewarm into GPU slots too (not only CPU memory)
    auto_promote: bool = True  # promote after the last step passes; False: wait for an operator
    thresholds: Thresholds = field(default_factory=Thresholds)
    probes: tuple[ProbeCase, ...] = ()  # extra probes (the revision's own probe always runs)


@dataclass(frozen=True)
class RevisionWindow:
    """One revision's live traffic over a canary step (what ``compare`` judges)."""

    requests: int = 0  # finished requests (completed or failed)
    errors: int = 0  # of which failed (server errors, generation failures, aborts by the server)
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p99_s: float | None = None
    good: int = 0  # client feedback
    bad: int = 0

    @property
    def error_rate(self) -> float | None:
        return None if self.requests == 0 else self.errors / self.requests
