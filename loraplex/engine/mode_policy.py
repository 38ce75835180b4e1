"""When to merge an adapter into the base weights: a pure, torch-free decision (the simulator
reuses it unchanged).

Merged, the top revision's tokens skip the LoRA op; every other token (other revisions and the
base model) pays one extra LoRA pass to take the merged delta back out. With ``share`` the top
revision's fraction of recent tokens, ``rate`` the tokens per second and ``c`` the measured LoRA
cost per token, merging saves ``share * rate * c`` and costs ``(1 - share) * rate * c`` seconds
per second, so it pays only above half the traffic, and only if the gain repays the measured
transition cost within ``payback_s``. Hysteresis: merging needs ``merge_share``, unmerging
needs the share to fall below the lower ``unmerge_share``, and no transition follows another
within ``min_dwell_s``. Evidence: no merge or switch on a window of fewer than
``min_window_tokens`` tokens, nor an unmerge unless those few span half of ``window_s`` (the
merged-slower veto's unmerge excepted). Baseline: nothing is merged before
``min_measured_steps`` unmerged steps were measured, so the veto on merged steps measured slower
(``mode_costs.StepCosts``) always has an unmerged figure to compare with. Nor is anything
merged while ``c`` is still a prior (``MeasuredCosts.lora_measured``: :class:`LoraCostMeter` has
not timed enough steps).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass

MERGED_PREFIX = "merged:"
SLOWER_MARGIN = 1.05  # merged steps must cost 5 % more per token to count as slower (noise)


class ModeKind(enum.Enum):
    UNMERGED = "unmerged"  # always the batched LoRA op (the default)
    MERGED = "merged"  # one revision, fixed (a dedicated replica)
    AUTO = "auto"  # decided from measured traffic by :func:`decide`


@dataclass(frozen=True)
class ModeSetting:
    """The ``mode`` setting: ``unmerged`` | ``merged:<tenant/name@revision>`` | ``auto``."""

    kind: ModeKind  # which of the three
    revision: str | None = None  # MERGED: the adapter ref to keep merged; None otherwise

    @classmethod
    def parse(cls, text: str) -> ModeSetting:
        if text in (ModeKind.UNMERGED.value, ModeKind.AUTO.value):
            return cls(ModeKind(text))
        ref = text[len(MERGED_PREFIX) :] if text.startswith(MERGED_PREFIX) else ""
        # NOTE: the engine matches the ref against ``tenant/name@revision`` (mode_control's
        # ``ref_of``): a ref without its tenant (``merged:support@r1``) was taken and never merged
        tenant, slash, rest = ref.partition("/")
        name, at, revision = rest.partition("@")
        if not (tenant and slash and name and at and revision) or "/" in rest or "@" in revision:
            raise ValueError(
                f"mode {text!r} is invalid; expected 'unmerged', 'auto' or "
                "'merged:<tenant/name@revision>'"
            )
        return cls(ModeKind.MERGED, ref)


# ``merge_step_budget_s``'s default (docs/modes.md, "Staged merge (2026-12-07, mergestall)"): on
# the large preset in bfloat16 on a shared 2-core Zen 4 (decode step of 20 sequences 86-92 ms),
# ``bench modes``' after-opening P99 TTFT went from 1.32-1.36x unmerged's (in-place merge) to
# 1.01-1.05x at 0.02 s and 1.04x at 0.05 s; but at 0.02 s the staging took 38-47 boundaries
# (0.70-0.86 s: a piece costs more between steps than in a row) and the 80 % throughput fell to
# 0.93-0.95 (main 1.02-1.04), at 0.05 s 12 boundaries and 1.023 (one run). The small preset's
# whole merge (about 4 ms) commits at the first boundary.
MERGE_STEP_BUDGET_S = 0.05


def check_merge_step_budget(budget_s: float, mode: str) -> None:
    """ValueError naming ``merge_step_budget_s`` when it is not > 0, or set (not the default)
    while ``mode`` is ``unmerged``, where nothing merges and nothing reads it."""
    if not budget_s > 0:  # NaN too
        raise ValueError(f"merge_step_budget_s {budget_s} is invalid; expected > 0")
    if budget_s != MERGE_STEP_BUDGET_S and ModeSetting.parse(mode).kind is ModeKind.UNMERGED:
        raise ValueError(
            f"merge_step_budget_s {budget_s} is set while mode is unmerged; expected mode auto "
            "or merged:<ref>, or merge_step_budget_s left out (only a merge reads it)"
        )


@dataclass(frozen=True)
class ModePolicyConfig:
    """Thresholds of :func:`decide`."""

    window_s: float = 30.0  # how far back "recent work" reaches
    merge_share: float = 0.6  # top revision's token share needed to merge
    unmerge_share: float = 0.45  # share below which a merged revision is unmerged
    min_dwell_s: float = 60.0  # no transition sooner than this after the last one
    payback_s: float = 10.0  # the gain must repay the transition cost within this time
    # steps timed in a mode before its per-token cost counts (StepCosts); no merge before this
    # many unmerged steps were timed, so the merged-slower veto has a baseline
    min_measured_steps: int = 8
    # no merge (nor switch) on a window of fewer tokens: a fresh engine's first requests are the
    # whole window, so in a fleet each replica merged whichever revision its first few requests
    # named, uniform traffic included, and held it for the dwell (docs/modes.md, "Topology,
    # measured"); 1024 is 16 prompts of 64 tokens
    min_window_tokens: int = 1024
    # a merged-slower verdict (StepCosts) is forgotten this long after it was first read, and
    # the next merge measures merged steps again: one stretch of traffic (one tenant's mix of
    # step sizes) must not keep every revision unmerged for the engine's life
    veto_s: float = 600.0
    # the most merge staging one step boundary runs (a staged merge, on a CPU: the merged
    # weights built beside the live ones, the steps kept waiting at most about this long for
    # it, and the commit one boundary of O(modules)); every mode, not only ``auto``
    merge_step_budget_s: float = MERGE_STEP_BUDGET_S

    def __post_init__(self) -> None:
        for name in ("window_s", "min_dwell_s", "payback_s", "veto_s", "merge_step_budget_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")
        if self.min_window_tokens < 1:
            raise ValueError(
                f"min_window_tokens {self.min_window_tokens} is invalid; expected >= 1"
            )
        if self.min_measured_steps < 1:
            raise ValueError(
                f"min_measured_steps {self.min_measured_steps} is invalid; expected >= 1"
            )
        if not 0.5 <= self.merge_share <= 1.0:
            raise ValueError(
                f"merge_share {self.merge_share} is invalid; expected 0.5 <= share <= 1 "
                "(below half, merging costs more LoRA work than it saves)"
            )
        if not 0.0 <= self.unmerge_share < self.merge_share:
            raise ValueError(
                f"unmerge_share {self.unmerge_share} is invalid; expected 0 <= share < "
                f"merge_share {self.merge_share} (the hysteresis band)"
            )


@dataclass(frozen=True)
class TrafficShare:
    """Recent work as the policy sees it."""

    shares: tuple[tuple[str, float], ...]  # (revision, fraction of recent tokens), largest first
    tokens_per_s: float  # all recent tokens per second (base-model tokens count too)
    tokens: int | None = None  # all recent tokens (None: not counted, taken as enough)
    # seconds from the window's oldest counted tokens to now (0: none; None: not known, taken
    # as the whole window): few tokens over a short span follow an idle gap
    span_s: float | None = None

    @property
    def top_revision(self) -> str | None:
        return self.shares[0][0] if self.shares else None

    @property
    def top_share(self) -> float:
        return self.shares[0][1] if self.shares else 0.0

    def share_of(self, revision: str) -> float:
        return next((share for name, share in self.shares if name == revision), 0.0)


@dataclass(frozen=True)
class MeasuredCosts:
    """What the engine measured (seconds)."""

    transition_s: float  # one merge or unmerge (median of those seen; a prior before any)
    lora_s_per_token: float  # the unmerged LoRA op's cost per token (all layers)
    # Whole steps' seconds per token seen merged / unmerged (StepCosts); None: not measured.
    # No merge while the unmerged figure is None; when both are known and merged steps ran
    # slower, the model above is overruled.
    merged_step_s_per_token: float | None = None
    unmerged_step_s_per_token: float | None = None
    # False: ``lora_s_per_token`` is still a prior (LoraCostMeter not yet measured): no merge
    lora_measured: bool = True

    @property
    def merged_measured_slower(self) -> bool:
        merged, unmerged = self.merged_step_s_per_token, self.unmerged_step_s_per_token
        return merged is not None and unmerged is not None and merged > unmerged * SLOWER_MARGIN


class Action(enum.Enum):
    STAY = "stay"
    MERGE = "merge"  # merge ``revision`` (nothing is merged)
    UNMERGE = "unmerge"  # back to unmerged
    SWITCH = "switch"  # unmerge, then merge ``revision``


@dataclass(frozen=True)
class ModeDecision:
    action: Action  # what to do between the next two steps
    revision: str | None  # MERGE/SWITCH: the revision to merge
    reason: str  # why, for traces and logs


def decide(
    merged: str | None,
    since_transition_s: float | None,
    traffic: TrafficShare,
    costs: MeasuredCosts,
    config: ModePolicyConfig,
    *,
    refused: Collection[str] = (),
) -> ModeDecision:
    """The ``auto`` mode's choice. ``merged``: the merged revision or None; ``since_transition_s``:
    seconds since the last transition (None: there was none); ``refused``: revisions whose merge
    was refused, never a merge's target (the merged one is then kept or unmerged by its share)."""
    if costs.merged_measured_slower:  # at once: a veto is no flapping (it holds for veto_s)
        if merged is not None:
            return ModeDecision(Action.UNMERGE, None, "merged steps measured slower per token")
        return ModeDecision(Action.STAY, None, "merged steps measured slower per token")
    if since_transition_s is not None and since_transition_s < config.min_dwell_s:
        return ModeDecision(Action.STAY, None, "dwell: the last transition is too recent")
    top, share = traffic.top_revision, traffic.top_share
    gain_s = (2.0 * share - 1.0) * traffic.tokens_per_s * costs.lora_s_per_token * config.payback_s
    hot = top is not None and top != merged and share >= config.merge_share and top not in refused
    if traffic.tokens is not None and traffic.tokens < config.min_window_tokens:
        hot = False  # a share of a few requests says nothing yet
        if merged is None:
            return ModeDecision(Action.STAY, None, "too few recent tokens to judge their shares")
        # Unmerged by its share on few tokens only when they span half the window (light
        # traffic, steadily: the pin is given back). NOTE: not gated before, and after an idle gap
        # longer than ``window_s`` the window was empty at the next step: the merged revision's
        # share read 0, it was unmerged before the first returning request ran (whichever
        # revision that was) and ``min_dwell_s`` then held off the re-merge for a minute.
        if traffic.span_s is not None and traffic.span_s < config.window_s / 2:
            return ModeDecision(Action.STAY, None, "too few tokens since traffic resumed")
    if hot and costs.unmerged_step_s_per_token is None:  # the veto needs a baseline first
        hot = False
        if merged is None:
            return ModeDecision(Action.STAY, None, "unmerged steps not measured yet")
    if hot and not costs.lora_measured:  # the gain is weighed with a measured cost only
        hot = False
        if merged is None:
            return ModeDecision(Action.STAY, None, "the LoRA cost is not measured yet")
    if merged is None:
        if hot and gain_s > costs.transition_s:
            return ModeDecision(Action.MERGE, top, f"{top} carries {share:.2f} of recent tokens")
        return ModeDecision(Action.STAY, None, "no merge pays")
    if hot and gain_s > 2.0 * costs.transition_s:  # a switch is two transitions
        return ModeDecision(Action.SWITCH, top, f"{top} carries {share:.2f} of recent tokens")
    mine = traffic.share_of(merged)
    if mine < config.unmerge_share:
        return ModeDecision(Action.UNMERGE, None, f"{merged} carries {mine:.2f} of recent tokens")
    return ModeDecision(Action.STAY, None, "within the hysteresis band")


class TokenWindow:
    """Tokens per revision over the last ``window_s`` (events kept in time order). The rate is
    over the time actually observed: ``window_s``, or less while fewer seconds than that have
    passed since ``start_s`` (when counting began). NOTE: dividing by ``window_s`` from the
    start under-reported the rate by ``elapsed / window_s`` for the first ``window_s``, so a
    merge whose transition costs more than a few steps never paid then (a short trace never
    merged on the large preset)."""

    def __init__(self, window_s: float, start_s: float) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s {window_s} is invalid; expected > 0")
        self.window_s, self.start_s = window_s, start_s
        self._events: deque[tuple[float, str | None, int]] = deque()
        self._totals: dict[str | None, int] = {}

    def record(self, now_s: float, revision: str | None, num_tokens: int) -> None:
        """``num_tokens`` of ``revision`` (None: the base model) ran at ``now_s``."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens {num_tokens} is invalid; expected >= 0")
        self._events.append((now_s, revision, num_tokens))
        self._totals[revision] = self._totals.get(revision, 0) + num_tokens
        self._expire(now_s)

    def share(self, now_s: float) -> TrafficShare:
        self._expire(now_s)
        total = sum(self._totals.values())
        adapters = sorted(
            ((r, n / total) for r, n in self._totals.items() if r is not None and n > 0),
            key=lambda item: (-item[1], item[0]),  # ties: the first name
        )
        observed_s = min(self.window_s, now_s - self.start_s)
        rate = total / observed_s if observed_s > 0 else 0.0
        span_s = now_s - self._events[0][0] if self._events else 0.0
        return TrafficShare(tuple(adapters), rate, total, span_s)

    def _expire(self, now_s: float) -> None:
        while self._events and self._events[0][0] < now_s - self.window_s:
            _, revision, num_tokens = self._events.popleft()
            self._totals[revision] -= num_tokens
            if not self._totals[revision]:
                del self._totals[revision]


class LoraCostMeter:
    """The unmerged LoRA op's seconds per LoRA token, measured on sampled steps (an exponential
    moving average): the figure ``decide`` weighs merging with. Until ``min_samples`` steps were
    measured it is ``prior`` (the operator's estimate, or ``loraplex bench modes``'s)."""

    def __init__(self, prior: float, weight: float = 0.1, min_samples: int = 8) -> None:
        if not prior >= 0:
            raise ValueError(f"lora_s_per_token {prior} is invalid; expected >= 0")
        if not 0 < weight <= 1:
            raise ValueError(f"weight {weight} is invalid; expected 0 < weight <= 1")
        if min_samples < 1:
            raise ValueError(f"min_samples {min_samples} is invalid; expected >= 1")
        self.prior, self.weight, self.min_samples = prior, weight, min_samples
        self.num_samples = 0
        self._mean: float | None = None

    def record(self, seconds: float, num_lora_tokens: int) -> None:
        """One measured step: its LoRA work took ``seconds`` for ``num_lora_tokens`` tokens that
        carry an adapter (a step without any says nothing and is skipped)."""
        if num_lora_tokens < 1 or seconds < 0:
            return
        value = seconds / num_lora_tokens
        old = self._mean
        self._mean = value if old is None else old + self.weight * (value - old)
        self.num_samples += 1

    @property
    def measured(self) -> bool:
        return self._mean is not None and self.num_samples >= self.min_samples

    def due(self, step: int, every: int) -> bool:
        """Whether unmerged step number ``step`` is to be timed: every one until measured (so
        ``min_samples`` timed steps come before ``decide`` may merge), then one in ``every``."""
        return not self.measured or step % every == 0

    def per_token(self) -> float:
        """The measured average once ``min_samples`` steps were seen; ``prior`` before."""
        return self._mean if self._mean is not None and self.measured else self.prior
