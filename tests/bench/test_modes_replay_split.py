"""Where a ``bench modes`` replay's time goes: each step's record, its kind, and the per-kind
sums of ``auto`` against unmerged on the same steps (bench/modes/replay_split.py)."""

from __future__ import annotations

import random

import pytest

from loraplex.bench.modes.auto_mode import AutoMode
from loraplex.bench.modes.replay import replay, summary, trace
from loraplex.bench.modes.replay_split import KINDS, StepRecord, step_kind, time_split
from loraplex.bench.modes.setup import HOT, ModesBenchConfig, Setup
from loraplex.engine.mode_policy import MeasuredCosts, ModePolicyConfig

QUICK = ModesBenchConfig(batch_size=4, context_tokens=8, rounds=1, calls_per_round=1)
PAYS = MeasuredCosts(transition_s=1e-6, lora_s_per_token=1.0, unmerged_step_s_per_token=1.0)
EAGER = ModePolicyConfig(min_measured_steps=2, min_window_tokens=1)


def step(
    forward_s: float,
    *,
    prefill: int = 0,
    decode: int = 4,
    hot_prefill: int = 0,
    hot_decode: int = 4,
    merged: bool = False,
    decide_s: float = 0.0,
) -> StepRecord:
    return StepRecord(
        decide_s, forward_s, 0.001, 4, prefill, decode, hot_prefill, hot_decode, merged
    )


def test_a_step_s_kind_says_what_it_carried() -> None:
    assert step_kind(0, step(1.0, prefill=64, merged=True), True) == "opening"
    assert step_kind(3, step(1.0), False) == "before_merge"
    assert step_kind(9, step(1.0), True) == "unmerged_after_merge"
    # a prompt of another revision: its whole chunk takes the negative pass
    foreign = step(1.0, prefill=64, hot_prefill=0, merged=True)
    assert step_kind(5, foreign, True) == "merged_foreign_prompt"
    mixed = step(1.0, prefill=128, hot_prefill=64, merged=True)
    assert step_kind(5, mixed, True) == "merged_foreign_prompt"
    hot = step(1.0, prefill=64, hot_prefill=64, decode=4, hot_decode=2, merged=True)
    assert step_kind(5, hot, True) == "merged_hot_prompt"
    assert step_kind(5, step(1.0, hot_decode=3, merged=True), True) == "merged_decode_foreign"
    assert step_kind(5, step(1.0, merged=True), True) == "merged_decode_hot_only"


def test_the_split_sets_each_auto_step_against_the_same_unmerged_step() -> None:
    # three steps: the opening, one unmerged step before the merge, one merged decode step
    unmerged = [
        [step(0.10, prefill=64), step(0.02), step(0.02, hot_decode=3)],
        [step(0.12, prefill=64), step(0.04), step(0.04, hot_decode=3)],
    ]
    auto = [
        [
            step(0.11, prefill=64),
            step(0.03, decide_s=0.005),
            step(0.02, hot_decode=3, merged=True),
        ]
    ] * 2
    got = time_split(unmerged, auto)
    assert set(KINDS) <= set(got)
    opening = got["opening"]
    assert isinstance(opening, dict)
    assert opening["steps"] == 2
    assert opening["unmerged_s"] == pytest.approx(0.22)  # the mean 0.11, once per auto replay
    assert opening["gain"] == pytest.approx(1.0)
    merged = got["merged_decode_foreign"]
    assert isinstance(merged, dict)
    assert merged["auto_s"] == pytest.approx(0.04) and merged["gain"] == pytest.approx(1.5)
    assert got["merged_decode_hot_only"] == {
        "steps": 0,
        "auto_s": 0.0,
        "unmerged_s": 0.0,
        "gain": None,
    }
    assert got["auto_decide_s"] == pytest.approx(0.01) and got["unmerged_decide_s"] == 0.0
    assert got["unmerged_forward_s"] == pytest.approx(0.34)
    assert got["auto_bookkeeping_s"] == pytest.approx(0.006)


def test_the_split_refuses_replays_of_different_steps() -> None:
    with pytest.raises(ValueError, match="the same steps"):
        time_split([[step(0.1), step(0.1)]], [[step(0.1)]])
    with pytest.raises(ValueError, match="both modes"):
        time_split([], [[step(0.1)]])


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    return Setup(tmp_path_factory.mktemp("modes"), QUICK)


def test_a_real_replay_records_every_step_s_work(setup: Setup) -> None:
    vocab = setup.model.config.vocab_size
    requests = trace(random.Random(1), 8, 0.8, 4, vocab, output_tokens=(2, 4))
    plain = replay(setup, requests, 3, None)
    auto = AutoMode(setup, PAYS, EAGER)
    try:
        merged = replay(setup, requests, 3, auto)
    finally:
        auto.close()
    for run in (plain, merged):
        log = run.step_log
        assert len(log) == run.steps
        assert sum(r.prefill_tokens + r.decode_tokens for r in log) == run.tokens
        assert sum(r.prefill_tokens for r in log) == sum(len(r.prompt) for r in requests)
        hot = sum(len(r.prompt) for r in requests if r.slot == HOT)
        assert sum(r.hot_prefill_tokens for r in log) == hot
        assert sum(r.merged for r in log) == run.merged_steps
        assert log[0].prefill_tokens == 3 * 4 and log[0].decode_tokens == 0  # the opening
        assert all(r.forward_s > 0 for r in log)
        assert sum(r.decide_s + r.forward_s + r.bookkeeping_s for r in log) <= run.seconds
    # the same work step by step in both modes; only auto decides
    work = [(r.prefill_tokens, r.decode_tokens, r.hot_decode_tokens) for r in plain.step_log]
    assert work == [
        (r.prefill_tokens, r.decode_tokens, r.hot_decode_tokens) for r in merged.step_log
    ]
    assert merged.merged_steps > 0 and not any(r.merged for r in plain.step_log)
    split = summary([plain], [merged])["time_split"]
    assert isinstance(split, dict)
    kinds = [split[kind] for kind in KINDS]
    assert sum(row["steps"] for row in kinds) == merged.steps
    assert sum(row["auto_s"] for row in kinds) == pytest.approx(split["auto_forward_s"])
    assert sum(row["unmerged_s"] for row in kinds) == pytest.approx(split["unmerged_forward_s"])
