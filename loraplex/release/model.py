"""What a release is: its states, the operator's plan, the thresholds it is judged by (torch-free).

    staged ──▶ prewarming ──▶ probing ──▶ canary(step 0..n-1) ──▶ promoted
      │            │             │            │                       │
      └────────────┴─────────────┴────────────┴──▶ aborted | rolled_back ◀─┘ (operator)

``staged``: written by ``release start``; the controller picks it up. ``prewarming``: the
candidate is loaded into CPU memory (L1; and GPU slots with ``gpu``) while the stable revision
stays resident. ``probing``: greedy output probes must pass; no tenant traffic reaches the
candidate before they do. ``canary``: a sticky share (``plan.ladder[step]``) of the alias's
callers gets the candidate; each step lasts at least ``plan.dwell_s`` and is compared against
the stable revision over the step; one that has not passed after ``effective_max_step_s`` is
rolled back (not enough traffic to judge). ``promoted``: the alias points at the candidate; the old
stable revision stays pinned in L1 until ``hold_until`` (delayed eviction). ``rolled_back``:
a probe or threshold failed, or an operator said so; all traffic is on the stable revision.
``aborted``: stopped before canary traffic, or the release could not go on (e.g. the candidate
failed to load). The one edge out of a terminal state: an operator may roll a ``promoted``
release back (the alias returns to the baseline through its history). ``machine.py`` holds the
graph; anything else raises ``InvalidTransitionError``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from loraplex.registry.models import probe_text_error

# What one release may ask of the engine and of every controller tick (a plan is read back from
# the database at each): its canary steps, its extra probes, each probe's prompt and expected
# text (characters, as a revision's own probe: ``MAX_PROBE_TEXT_CHARS``) and the tokens it
# generates. Not settings. ``check_plan_bounds`` holds them for every way in (the admin API,
# ``release start``, ``ReleaseStore.start_release``) and for a stored plan before its probes run.
# NOTE: only the admin API's body held them; ``release start --probe-file`` took 3,000 probes
# of 100,000 tokens each (and any JSON type per field), all launched on the engine at once
# (docs/benchmarks/attack27.md).
MAX_LADDER_STEPS = 16
MAX_PROBES = 32
MAX_PROBE_TOKENS = 256
# The longest ``dwell_s``, ``window_s`` and ``max_step_s`` (30 days), held with the bounds
# above. NOTE: only ``>= 0`` was checked, and the admin body refused only infinity: ``release
# start --window inf`` stored ``Infinity`` (a release page holding it cannot be sent: JSON
# responses refuse infinity), and a finite ``1e300`` gave a ``hold_until`` no date can show
# (``datetime`` raises OverflowError, which ``release status`` does not catch).
MAX_PLAN_SECONDS = 30 * 86400.0


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
    # Latency samples each side needs before a P99 ratio is judged (below ~100 samples the
    # nearest-rank P99 is the one slowest request).
    min_latency_samples: int = 50
    # A step still short of evidence after this long ends: rolled back as "not enough traffic to
    # judge" (a candidate nobody calls is not proven); None: 10 x dwell_s, at least 1 h.
    max_step_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_error_rate", "max_error_rate_over_stable", "max_bad_feedback_ratio"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} {value} is invalid; expected 0 <= {name} <= 1")
        for name in ("max_ttft_p99_ratio", "max_tpot_p99_ratio"):
            value = getattr(self, name)
            if not value > 0.0:
                raise ValueError(f"{name} {value} is invalid; expected > 0")
        for name in ("min_requests", "min_latency_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")
        if self.max_step_s is not None and not self.max_step_s > 0.0:
            raise ValueError(f"max_step_s {self.max_step_s} is invalid; expected > 0")


@dataclass(frozen=True)
class ProbeCase:
    """One output probe, run greedily on the candidate before any traffic reaches it."""

    prompt: str  # sent as a completion prompt
    expected: str | None = None  # the greedy continuation must start with this
    differ_from_stable: bool = False  # the candidate's continuation must differ from stable's
    max_tokens: int = 16  # tokens generated for the probe

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("prompt '' is invalid; expected a non-empty prompt")
        if self.expected is None and not self.differ_from_stable:
            raise ValueError("expected is None and differ_from_stable is False; a probe checks one")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens {self.max_tokens} is invalid; expected >= 1")


def probe_bounds_error(probe: ProbeCase) -> str | None:
    """Why ``probe`` is out of bounds or of the wrong type (naming the field); None when not."""
    for name in ("prompt", "expected"):
        text = getattr(probe, name)
        error = None if text is None and name == "expected" else probe_text_error(name, text)
        if error is not None:
            return error
    differ: object = probe.differ_from_stable  # a probe file's JSON may hold any type
    if not isinstance(differ, bool):
        return f"differ_from_stable {differ!r} is invalid; expected true or false"
    tokens: object = probe.max_tokens
    if (
        isinstance(tokens, bool)
        or not isinstance(tokens, int)
        or not 1 <= tokens <= MAX_PROBE_TOKENS
    ):
        return f"max_tokens {tokens!r} is invalid; expected an integer from 1 to {MAX_PROBE_TOKENS}"
    return None


def check_plan_bounds(
    ladder: Sequence[float],
    probes: Sequence[ProbeCase],
    durations: Mapping[str, float] | None = None,
) -> None:
    """Raises ``ValueError`` naming what is over ``MAX_LADDER_STEPS``, ``MAX_PROBES``, a
    probe's bounds (``probe_bounds_error``) or ``MAX_PLAN_SECONDS`` (``durations``: name ->
    seconds, ``ReleasePlan.durations``)."""
    for name, seconds in (durations or {}).items():
        if not seconds <= MAX_PLAN_SECONDS:
            raise ValueError(
                f"{name} {seconds} is invalid; expected at most {MAX_PLAN_SECONDS:.0f} s (30 days)"
            )
    if len(ladder) > MAX_LADDER_STEPS:
        raise ValueError(
            f"ladder of {len(ladder)} steps is invalid; expected at most {MAX_LADDER_STEPS}"
        )
    if len(probes) > MAX_PROBES:
        raise ValueError(f"probes: {len(probes)} is invalid; expected at most {MAX_PROBES}")
    for index, probe in enumerate(probes):
        error = probe_bounds_error(probe)
        if error is not None:
            raise ValueError(f"probe {index}: {error}")


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

    @property
    def durations(self) -> dict[str, float]:
        """The plan's durations in seconds by name (``check_plan_bounds``'s ``durations``)."""
        limit = self.thresholds.max_step_s
        return {
            "dwell_s": self.dwell_s,
            "window_s": self.window_s,
            **({} if limit is None else {"max_step_s": limit}),
        }

    @property
    def effective_max_step_s(self) -> float:
        """How long one canary step may wait for evidence (``Thresholds.max_step_s``)."""
        limit = self.thresholds.max_step_s
        return max(10.0 * self.dwell_s, 3600.0) if limit is None else limit

    def __post_init__(self) -> None:
        ladder = self.ladder
        if not ladder or any(not 0.0 < share <= 1.0 for share in ladder):
            raise ValueError(f"ladder {ladder} is invalid; expected shares in (0, 1]")
        if any(b <= a for a, b in itertools.pairwise(ladder)):
            raise ValueError(f"ladder {ladder} is invalid; expected strictly increasing shares")
        for name in ("dwell_s", "window_s"):
            value = getattr(self, name)
            if not value >= 0.0:
                raise ValueError(f"{name} {value} is invalid; expected >= 0")
        if self.effective_max_step_s < self.dwell_s:
            raise ValueError(
                f"max_step_s {self.effective_max_step_s} is invalid; expected >= dwell_s "
                f"{self.dwell_s} (a step could never pass)"
            )


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
    ttft_samples: int = 0  # requests behind the TTFT percentiles
    tpot_samples: int = 0  # requests behind the TPOT percentiles
    callers: int = 0  # distinct callers among ``requests`` (``release.traffic.caller_key``)
    top_caller_requests: int = 0  # requests of the caller with the most errors (0: no errors)
    top_caller_errors: int = 0  # that caller's errors
    top_rater_good: int = 0  # good ratings of the caller with the most bad ones (0: none bad)
    top_rater_bad: int = 0  # that caller's bad ratings
    # Of the rest, the caller with the most successful requests (0: none), and the one with the
    # most good ratings: left out too, so one caller's successes cannot hide others' failures.
    best_caller_requests: int = 0
    best_caller_errors: int = 0
    best_rater_good: int = 0
    best_rater_bad: int = 0
    # The P99s judged, and their samples: without the caller whose absence lowers the P99 most
    # and the one whose absence raises it most (``release/callers.py``).
    ttft_p99_judged_s: float | None = None
    ttft_judged_samples: int = 0
    tpot_p99_judged_s: float | None = None
    tpot_judged_samples: int = 0

    @property
    def error_rate(self) -> float | None:
        return None if self.requests == 0 else self.errors / self.requests

    def without_top_callers(self) -> RevisionWindow:
        """The counts without the caller that failed most, the one that succeeded most, the one
        that rated worst and the one that rated best: what error and feedback checks judge, so
        that no single caller decides a release alone, either way."""
        return replace(
            self,
            requests=self.requests - self.top_caller_requests - self.best_caller_requests,
            errors=self.errors - self.top_caller_errors - self.best_caller_errors,
            good=self.good - self.top_rater_good - self.best_rater_good,
            bad=self.bad - self.top_rater_bad - self.best_rater_bad,
            top_caller_requests=0,
            top_caller_errors=0,
            top_rater_good=0,
            top_rater_bad=0,
            best_caller_requests=0,
            best_caller_errors=0,
            best_rater_good=0,
            best_rater_bad=0,
        )


@dataclass(frozen=True)
class Comparison:
    """The latest judgement of a canary step, persisted so the CLI can show it."""

    step: int  # ladder step judged
    at: float  # controller clock seconds when judged
    candidate: RevisionWindow  # the candidate's traffic since the step started
    stable: RevisionWindow  # the baseline's traffic over the same time
    breaches: tuple[str, ...] = ()  # thresholds crossed (empty: none)
    passed: bool = False  # the step met its dwell and minimum requests with no breach


@dataclass(frozen=True)
class Release:
    """One release of ``tenant/name`` as persisted (``store.py``); a change is a new record."""

    release_id: str  # unique id, also salts the sticky canary hash
    tenant: str  # owning tenant of the alias
    name: str  # adapter (alias) name
    candidate: str  # revision label on trial
    baseline: str  # the alias's stable revision when the release started
    state: ReleaseState
    step: int  # current ladder step (meaningful in canary and after)
    plan: ReleasePlan
    created_at: float  # epoch seconds
    updated_at: float  # epoch seconds of the last transition
    step_started_at: float | None  # when the current canary step began (controller clock)
    reason: str | None  # why it is where it is (failing probe, breach, operator)
    actor: str  # who started it
    hold_until: float | None  # baseline pinned until then; None when no hold is pending
    version: int  # transitions so far; the compare-and-set token
    comparison: Comparison | None = None  # latest canary judgement

    @property
    def alias_ref(self) -> str:
        return f"{self.tenant}/{self.name}"

    @property
    def candidate_ref(self) -> str:
        return f"{self.tenant}/{self.name}@{self.candidate}"

    @property
    def baseline_ref(self) -> str:
        return f"{self.tenant}/{self.name}@{self.baseline}"

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def share(self) -> float:
        """The candidate's sticky share of unpinned callers right now."""
        return self.plan.ladder[self.step] if self.state is ReleaseState.CANARY else 0.0
