"""``bench modes``' request-level replay: TTFT and throughput per mode from whole requests, the
same work in both modes, and any differing token fails the bench (and the CLI exits 1)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from typer.testing import CliRunner

from loraplex.bench.modes.auto_mode import AutoMode
from loraplex.bench.modes.decisions import flaps_per_min
from loraplex.bench.modes.parity import ParityReport, ParityRule, ProbeMismatchError
from loraplex.bench.modes.replay import (
    ReplayRequest,
    ReplayRun,
    compare_modes,
    hot_token_share,
    replay,
    summary,
    trace,
)
from loraplex.bench.modes.setup import HOT, ModesBenchConfig, Setup
from loraplex.cli import app
from loraplex.engine.mode_policy import MeasuredCosts, ModePolicyConfig
from loraplex.model.merge import MergedLoraApplier, WeightMerger, linear_of
from loraplex.model.staged_merge import MergeStaging

QUICK = ModesBenchConfig(batch_size=4, context_tokens=8, rounds=1, calls_per_round=1)
# merging always pays (the unmerged baseline given: the replay's auto measures its own)
PAYS = MeasuredCosts(transition_s=1e-6, lora_s_per_token=1.0, unmerged_step_s_per_token=1.0)
EXACT = ParityRule(exact=True)
# a short replay's auto may merge (few steps, few tokens) and stages its merge in one piece
# (the budget's own test: tests/engine/test_mode_staging.py)
EAGER = ModePolicyConfig(min_measured_steps=2, min_window_tokens=1, merge_step_budget_s=60.0)


def tokens(run: ReplayRun) -> list[list[int]]:
    return [[step.token for step in out] for out in run.outputs]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    return Setup(tmp_path_factory.mktemp("modes"), QUICK)


def requests_for(setup: Setup, share: float | None, num: int = 6) -> list[ReplayRequest]:
    vocab = setup.model.config.vocab_size
    return trace(random.Random(1), num, share, 4, vocab, output_tokens=(2, 4))


def test_the_trace_carries_the_share_it_names(setup: Setup) -> None:
    skewed = requests_for(setup, 0.8, num=20)
    assert sum(r.slot == HOT for r in skewed) == 16
    assert 0.6 < hot_token_share(skewed) < 0.95  # output lengths differ per request
    assert {r.max_tokens for r in skewed} <= {2, 3, 4}
    uniform = requests_for(setup, None, num=32)
    assert Counter(r.slot for r in uniform) == Counter(list(range(16)) * 2)


def test_a_replay_times_every_request_and_auto_merges_the_hot_revision(setup: Setup) -> None:
    requests = requests_for(setup, 0.8)
    plain = replay(setup, requests, 3, None)
    auto = AutoMode(setup, PAYS, EAGER)
    try:
        merged = replay(setup, requests, 3, auto)
        during = (auto.merged, type(auto.applier))
    finally:
        auto.close()
    assert during == (HOT, MergedLoraApplier)
    assert (auto.merged, auto.applier) == (None, setup.pool)  # close unmerged it
    assert tokens(merged) == tokens(plain)  # same tokens, merged or not
    assert [len(o) for o in plain.outputs] == [r.max_tokens for r in requests]
    assert plain.tokens == sum(len(r.prompt) + r.max_tokens - 1 for r in requests)
    assert all(0 < t <= plain.seconds for t in plain.ttft_s)
    assert len(set(plain.ttft_s[:3])) == 1  # submitted together, first tokens in one step
    assert plain.first_step[:3] == [0, 0, 0] and min(plain.first_step[3:]) > 0
    assert plain.after_transition == [] and len(merged.after_transition) == 1
    assert merged.first_step == plain.first_step  # steps depend on step counts only
    assert merged.transitions == 1 and 0 < merged.merged_steps < merged.steps
    assert plain.transitions == plain.merged_steps == 0
    # the meter was fed before the merge (it was null in every replay of issue 28's runs)
    assert merged.lora_s_per_token is not None and 0 < merged.lora_s_per_token < 1.0
    assert plain.lora_s_per_token is None


def test_the_summary_reports_both_modes_and_their_ratios() -> None:
    fast = ReplayRun(1.0, 200, [0.01, 0.02], [[1], [2]], 10, first_step=[0, 3])
    slow = ReplayRun(
        2.0, 200, [0.02, 0.04], [[1], [2]], 10, transitions=1, merged_steps=5, first_step=[0, 3]
    )
    got = summary([fast, fast], [slow, slow])
    assert got["unmerged_tokens_per_s"] == pytest.approx(200.0)
    assert got["throughput_auto_over_unmerged"] == pytest.approx(0.5)
    assert got["ttft_p99_auto_over_unmerged"] == pytest.approx(2.0)
    assert got["auto_transitions"] == 2 and got["auto_merged_step_share"] == pytest.approx(0.5)
    assert got["replays_per_mode"] == 2


def test_the_summary_says_which_steps_make_the_ttft_tail() -> None:
    # the opening burst (step 0) is the slowest: every P99 request is one of its clients
    opening = ReplayRun(1.0, 100, [0.05, 0.05, 0.01, 0.02], [[1]] * 4, 9, first_step=[0, 0, 4, 6])
    # a transition before step 5 stalls its request past the opening burst
    stalled = ReplayRun(1.0, 100, [0.03, 0.03, 0.08, 0.01], [[1]] * 4, 9, first_step=[0, 0, 5, 7])
    stalled.after_transition = [5]
    got = summary([opening], [stalled])
    assert got["unmerged_ttft_tail"] == {"opening_burst": 2, "after_transition": 0, "other": 0}
    assert got["auto_ttft_tail"] == {"opening_burst": 0, "after_transition": 1, "other": 0}
    assert got["unmerged_opening_ttft_ms_max"] == pytest.approx(50.0)
    assert got["auto_opening_ttft_ms_max"] == pytest.approx(30.0)
    assert got["unmerged_ttft_ms_p99_after_opening"] == pytest.approx(20.0)
    assert got["auto_ttft_ms_p99_after_opening"] == pytest.approx(80.0)
    assert got["ttft_p99_after_opening_auto_over_unmerged"] == pytest.approx(4.0)
    assert got["ttft_p99_auto_over_unmerged"] == pytest.approx(1.6)


@pytest.fixture
def wrong_merge(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every merge folds 50 times the adapter's delta in: a wrong merge outputs must catch (an
    unmerge still restores the original rows)."""
    real = WeightMerger.commit  # every merge of the bench is staged, then committed

    def commit(self: WeightMerger, staging: MergeStaging) -> None:
        real(self, staging)
        for module in staging.weights.modules:
            weight = linear_of(self.model, module.layer, module.module).weight
            weight.add_(module.scale * 50 * module.lora_b.float() @ module.lora_a.float())

    monkeypatch.setattr(WeightMerger, "commit", commit)


@pytest.mark.usefixtures("wrong_merge")
def test_a_wrong_merge_fails_the_replay(setup: Setup) -> None:
    with pytest.raises(ProbeMismatchError, match="under auto"):
        compare_modes(
            setup, requests_for(setup, 0.8), 3, PAYS, 1, report=ParityReport(EXACT), policy=EAGER
        )
    assert setup.merger._digest is None  # the failed replay unmerged on its way out


@pytest.mark.usefixtures("wrong_merge")
def test_the_cli_exits_1_when_an_output_differs() -> None:
    result = CliRunner().invoke(app, ["bench", "modes", "--json", "--batch-size", "2"])
    assert result.exit_code == 1
    assert "bench modes failed: probe of slot" in result.output


def test_the_flap_metric_counts_transitions_and_dwell_holds_it() -> None:
    rng = random.Random(0)
    assert flaps_per_min(PAYS, 4, rng) <= 1.0
    # without the dwell, each 30 s change of hot revision is a switch: about 2 per minute
    eager = ModePolicyConfig(min_dwell_s=1.0)
    assert flaps_per_min(PAYS, 4, random.Random(0), eager) >= 1.5
