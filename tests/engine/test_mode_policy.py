"""The merge/unmerge decision: thresholds, payback, hysteresis, dwell; the token window; the mode
setting. Traces replayed through decide() count transitions (no flapping)."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest

from loraplex.engine.mode_costs import StepCosts
from loraplex.engine.mode_policy import (
    Action,
    LoraCostMeter,
    MeasuredCosts,
    ModeKind,
    ModePolicyConfig,
    ModeSetting,
    TokenWindow,
    TrafficShare,
    decide,
)

CONFIG = ModePolicyConfig()
CHEAP = MeasuredCosts(transition_s=0.01, lora_s_per_token=1e-4, unmerged_step_s_per_token=1e-3)


def traffic(*shares: tuple[str, float], rate: float = 1000.0) -> TrafficShare:
    return TrafficShare(tuple(shares), rate)


def test_a_dominant_revision_is_merged() -> None:
    got = decide(None, None, traffic(("a@1", 0.8), ("b@1", 0.2)), CHEAP, CONFIG)
    assert (got.action, got.revision) == (Action.MERGE, "a@1")


def test_a_refused_revision_is_never_a_target() -> None:
    """A revision whose merge was refused is not merged or switched to; the merged one (if any)
    is kept or unmerged by its own share, as in the hysteresis band."""
    hot = traffic(("a@1", 0.8), ("b@1", 0.2))
    assert decide(None, None, hot, CHEAP, CONFIG, refused={"a@1"}).action is Action.STAY
    assert decide("b@1", 1e9, hot, CHEAP, CONFIG).action is Action.SWITCH
    assert decide("b@1", 1e9, hot, CHEAP, CONFIG, refused={"a@1"}).action is Action.UNMERGE
    kept = traffic(("a@1", 0.6), ("b@1", 0.4))
    low = replace(CONFIG, unmerge_share=0.3)  # b@1's 0.4 is inside the band
    assert decide("b@1", 1e9, kept, CHEAP, low).action is Action.SWITCH
    assert decide("b@1", 1e9, kept, CHEAP, low, refused={"a@1"}).action is Action.STAY


@pytest.mark.parametrize("share", [0.0, 0.3, 0.5, 0.59])
def test_below_the_merge_share_nothing_changes(share: float) -> None:
    got = decide(None, None, traffic(("a@1", share)), CHEAP, CONFIG)
    assert got.action is Action.STAY


def test_a_merge_that_does_not_repay_its_transition_is_not_made() -> None:
    slow = MeasuredCosts(transition_s=100.0, lora_s_per_token=1e-4, unmerged_step_s_per_token=1e-3)
    assert decide(None, None, traffic(("a@1", 0.9)), slow, CONFIG).action is Action.STAY
    idle = traffic(("a@1", 0.9), rate=0.1)
    assert decide(None, None, idle, CHEAP, CONFIG).action is Action.STAY


def test_hysteresis_band_keeps_a_merge_then_unmerges_below_it() -> None:
    assert decide("a@1", 1e9, traffic(("a@1", 0.5)), CHEAP, CONFIG).action is Action.STAY
    got = decide("a@1", 1e9, traffic(("b@1", 0.4), ("a@1", 0.3)), CHEAP, CONFIG)
    assert got.action is Action.UNMERGE


def test_a_window_of_few_tokens_merges_nothing() -> None:
    # A fresh engine's first request is its whole window: a share of 1.0. In a fleet each
    # replica so merged whichever revision it saw first, uniform traffic included (the fleet
    # topology bench, docs/modes.md "Topology, measured").
    window = TokenWindow(30.0, 0.0)
    window.record(0.5, "a@1", CONFIG.min_window_tokens - 1)
    thin = window.share(1.0)
    assert thin.top_share == 1.0 and thin.tokens == CONFIG.min_window_tokens - 1
    got = decide(None, None, thin, CHEAP, CONFIG)
    assert got.action is Action.STAY and "too few recent tokens" in got.reason
    # a merged b@1 is kept on a half-second's few tokens (an idle gap's first returning requests)
    assert decide("b@1", 1e9, thin, CHEAP, CONFIG).action is Action.STAY
    window.record(0.9, "a@1", 1)
    assert decide(None, None, window.share(1.0), CHEAP, CONFIG).action is Action.MERGE


def test_an_idle_gap_does_not_unmerge_the_merged_revision() -> None:
    """After an idle gap longer than ``window_s`` the window is empty at the next step, and
    then holds only the first returning requests' tokens. On main the merged revision's share
    read 0 there: it was unmerged before the first returning request ran, and ``min_dwell_s``
    held off its re-merge for a minute of its own traffic."""
    window = TokenWindow(CONFIG.window_s, 0.0)
    for second in range(30):
        window.record(float(second), "a@1", 100)
    assert decide("a@1", 1e9, window.share(30.0), CHEAP, CONFIG).action is Action.STAY
    empty = window.share(100.0)  # 70 s idle
    assert empty.tokens == 0 and empty.span_s == 0.0
    got = decide("a@1", 1e9, empty, CHEAP, CONFIG)
    assert got.action is Action.STAY and "since traffic resumed" in got.reason
    window.record(100.0, "b@1", 50)  # another tenant's request comes back first
    assert decide("a@1", 1e9, window.share(100.5), CHEAP, CONFIG).action is Action.STAY
    for second in range(101, 112):  # enough of b@1's tokens: a@1 is given back for b@1
        window.record(float(second), "b@1", 100)
    assert decide("a@1", 1e9, window.share(112.0), CHEAP, CONFIG).action is Action.SWITCH


def test_light_traffic_over_half_the_window_still_unmerges() -> None:
    """Few tokens spread over half the window or more are light traffic, not a gap's first
    requests: a merged revision that none of them used is given back (its pin too)."""
    window = TokenWindow(CONFIG.window_s, 0.0)
    for second in range(0, 20, 2):
        window.record(100.0 + second, "b@1", 10)  # 100 tokens in 18 s
    light = window.share(118.0)
    assert light.tokens == 100 < CONFIG.min_window_tokens
    assert light.span_s is not None and light.span_s >= CONFIG.window_s / 2
    assert decide("a@1", 1e9, light, CHEAP, CONFIG).action is Action.UNMERGE
    assert decide(None, None, light, CHEAP, CONFIG).action is Action.STAY  # nor a merge of b@1


def test_a_new_dominant_revision_is_switched_to() -> None:
    got = decide("a@1", 1e9, traffic(("b@1", 0.7), ("a@1", 0.1)), CHEAP, CONFIG)
    assert (got.action, got.revision) == (Action.SWITCH, "b@1")


def test_no_transition_within_the_dwell_time() -> None:
    got = decide("a@1", CONFIG.min_dwell_s - 1, traffic(("b@1", 1.0)), CHEAP, CONFIG)
    assert got.action is Action.STAY
    assert "dwell" in got.reason


def replay(hot_of: list[str], seconds: int, rng: random.Random) -> list[tuple[float, Action]]:
    """One step per second: 100 tokens, 80 % to the hot revision of that second."""
    window = TokenWindow(CONFIG.window_s, 0.0)
    merged: str | None = None
    last: float | None = None
    transitions = []
    for now in range(seconds):
        hot = hot_of[now]
        for _ in range(100):
            revision = hot if rng.random() < 0.8 else f"cold{rng.randrange(15)}@1"
            window.record(float(now), revision, 1)
        since = None if last is None else now - last
        got = decide(merged, since, window.share(float(now)), CHEAP, CONFIG)
        if got.action is not Action.STAY:
            merged = got.revision if got.action is not Action.UNMERGE else None
            last = float(now)
            transitions.append((float(now), got.action))
    return transitions


def test_alternating_hot_revision_switches_at_most_once_a_minute() -> None:
    minutes = 10
    hot_of = ["a@1" if (t // 30) % 2 == 0 else "b@1" for t in range(60 * minutes)]
    transitions = replay(hot_of, 60 * minutes, random.Random(0))
    assert transitions  # it does follow the traffic
    assert len(transitions) / minutes <= 1.0
    times = [t for t, _ in transitions]
    assert all(b - a >= CONFIG.min_dwell_s for a, b in itertools.pairwise(times))


def test_uniform_traffic_never_merges() -> None:
    window = TokenWindow(CONFIG.window_s, 0.0)
    rng = random.Random(1)
    for now in range(300):
        for _ in range(100):
            window.record(float(now), f"r{rng.randrange(16)}@1", 1)
        assert decide(None, None, window.share(float(now)), CHEAP, CONFIG).action is Action.STAY


def test_token_window_counts_tokens_not_requests_and_forgets_old_work() -> None:
    window = TokenWindow(10.0, -9.0)  # counting for 10 s already: the whole window
    window.record(0.0, "a@1", 90)
    window.record(1.0, "b@1", 10)
    window.record(1.0, None, 100)
    share = window.share(1.0)
    assert share.shares == (("a@1", 0.45), ("b@1", 0.05))
    assert share.tokens_per_s == 20.0
    assert share.span_s == 1.0  # from the oldest tokens kept
    assert window.share(10.5).shares == (("b@1", 10 / 110),)
    assert window.share(10.5).span_s == 9.5
    assert window.share(100.0) == TrafficShare((), 0.0, 0, 0.0)
    with pytest.raises(ValueError, match="num_tokens -1"):
        window.record(1.0, "a@1", -1)


def test_the_rate_is_over_the_seconds_observed_until_the_window_fills() -> None:
    window = TokenWindow(30.0, 100.0)  # counting began at 100 s
    assert window.share(100.0).tokens_per_s == 0.0  # nothing observed yet
    for now in range(101, 161):  # 50 tokens a second
        window.record(float(now), "a@1", 50)
        observed = min(30.0, now - 100.0)
        assert window.share(float(now)).tokens_per_s == pytest.approx(
            50 * min(now - 100, 31) / observed
        )
    assert window.share(160.0).tokens_per_s == pytest.approx(50 * 31 / 30)  # a full window


def test_a_short_trace_merges_once_the_observed_rate_repays_the_transition() -> None:
    """At 200 tokens/s with 0.8 on one revision, a merge of 0.3 s repays itself (gain 0.6 *
    200 * 1e-3 * 10 = 1.2 s); over a fixed 30 s denominator the rate read 200 * 6 / 30 at
    6 s and no merge paid (gain 0.24 s). (6 s: 1,200 tokens, above ``min_window_tokens``.)"""
    costs = MeasuredCosts(0.3, 1e-3, unmerged_step_s_per_token=1e-3)
    window = TokenWindow(CONFIG.window_s, 0.0)
    for now in range(1, 7):
        window.record(float(now), "a@1", 160)
        window.record(float(now), "b@1", 40)
    got = decide(None, None, window.share(6.0), costs, CONFIG)
    assert got.action is Action.MERGE and got.revision == "a@1"


@pytest.mark.parametrize(
    ("text", "kind", "revision"),
    [
        ("unmerged", ModeKind.UNMERGED, None),
        ("auto", ModeKind.AUTO, None),
        ("merged:acme/support@r1", ModeKind.MERGED, "acme/support@r1"),
    ],
)
def test_mode_setting_parses(text: str, kind: ModeKind, revision: str | None) -> None:
    assert ModeSetting.parse(text) == ModeSetting(kind, revision)


@pytest.mark.parametrize(
    "text",
    [
        *("", "merged", "merged:", "merged:acme", "merged:@r1", "fast"),
        # no tenant, or not one tenant/name pair: no revision the engine serves is named so,
        # and the setting was taken and never merged anything
        *("merged:support@r1", "merged:/support@r1", "merged:acme/@r1", "merged:a/b/c@r1"),
        "merged:acme/support@",
    ],
)
def test_bad_mode_setting_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match=r"mode .* is invalid"):
        ModeSetting.parse(text)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("merge_share", 0.4),
        ("unmerge_share", 0.7),
        ("min_dwell_s", 0.0),
        ("window_s", -1.0),
        ("min_measured_steps", 0),
        ("min_window_tokens", 0),
    ],
)
def test_policy_config_validates(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"{field} {value}"):
        ModePolicyConfig(**{field: value})


def test_merged_steps_measured_slower_unmerge_and_stop_merging() -> None:
    slower = MeasuredCosts(0.01, 1e-4, merged_step_s_per_token=2e-3, unmerged_step_s_per_token=1e-3)
    got = decide("a@1", 1e9, traffic(("a@1", 0.8)), slower, CONFIG)
    assert got.action is Action.UNMERGE and "measured slower" in got.reason
    assert decide(None, 1e9, traffic(("a@1", 0.9)), slower, CONFIG).action is Action.STAY
    # within the dwell too: merged steps measured slower need not run for min_dwell_s (a veto
    # holds for veto_s, so it cannot flap); each re-trial after veto_s costs its measured steps
    assert decide("a@1", 1.0, traffic(("a@1", 0.8)), slower, CONFIG).action is Action.UNMERGE
    within_noise = MeasuredCosts(0.01, 1e-4, 1.04e-3, 1e-3)
    assert decide(None, None, traffic(("a@1", 0.9)), within_noise, CONFIG).action is Action.MERGE


def test_nothing_is_merged_before_unmerged_steps_were_measured() -> None:
    """The merged-slower veto compares both modes' measured steps: a merge made before any
    unmerged step was timed would leave it nothing to compare with (issue 28)."""
    unmeasured = MeasuredCosts(transition_s=0.01, lora_s_per_token=1e-4)
    got = decide(None, None, traffic(("a@1", 0.9)), unmeasured, CONFIG)
    assert got.action is Action.STAY and "not measured" in got.reason
    # merged without a baseline (a fleet's dedication): no switch, the unmerge rule still holds
    assert decide("a@1", 1e9, traffic(("b@1", 0.9)), unmeasured, CONFIG).action is Action.UNMERGE
    assert decide(None, None, traffic(("a@1", 0.9)), CHEAP, CONFIG).action is Action.MERGE


def test_nothing_is_merged_on_a_prior_lora_cost() -> None:
    """The gain is weighed with the measured LoRA cost only (issue 28: the prior decided)."""
    prior = replace(CHEAP, lora_measured=False)
    got = decide(None, None, traffic(("a@1", 0.9)), prior, CONFIG)
    assert got.action is Action.STAY and "LoRA cost is not measured" in got.reason
    assert decide("a@1", 1e9, traffic(("b@1", 0.9)), prior, CONFIG).action is Action.UNMERGE
    assert decide("a@1", 1e9, traffic(("a@1", 0.9)), prior, CONFIG).action is Action.STAY


def test_the_lora_cost_is_timed_on_every_step_until_measured_then_sampled() -> None:
    meter = LoraCostMeter(2e-4, min_samples=2)
    assert [meter.due(step, 8) for step in range(1, 4)] == [True] * 3
    meter.record(0.01, 10)
    meter.record(0.01, 10)
    assert [meter.due(step, 8) for step in (1, 7, 8, 16)] == [False, False, True, True]


def test_step_costs_average_per_token_after_enough_steps() -> None:
    costs = StepCosts(weight=0.5, min_steps=2)
    costs.record(True, 0.1, 10)
    assert costs.per_token(True) is None  # one step is not a measurement
    costs.record(True, 0.3, 10)
    assert costs.per_token(True) == pytest.approx(0.02)
    costs.record(False, 1.0, 0)  # an empty step says nothing
    assert costs.per_token(False) is None
    with pytest.raises(ValueError, match="weight 0"):
        StepCosts(weight=0)


def test_the_lora_cost_is_the_prior_until_measured_then_an_average_per_lora_token() -> None:
    meter = LoraCostMeter(2e-4, weight=0.5, min_samples=2)
    assert meter.per_token() == 2e-4 and not meter.measured
    meter.record(0.01, 0)  # no adapter token in the step: says nothing
    meter.record(0.01, 100)
    assert meter.per_token() == 2e-4  # one timed step is not a measurement
    meter.record(0.03, 100)
    assert meter.measured and meter.per_token() == pytest.approx(2e-4)  # (1e-4 + 3e-4) / 2
    meter.record(0.0, 100)
    assert meter.per_token() == pytest.approx(1e-4)
    with pytest.raises(ValueError, match="lora_s_per_token -1"):
        LoraCostMeter(-1.0)
    with pytest.raises(ValueError, match="min_samples 0"):
        LoraCostMeter(1e-4, min_samples=0)
