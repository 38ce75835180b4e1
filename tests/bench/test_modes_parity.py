"""``bench modes``' parity rule: float32 exact; in 16-bit dtypes merged may differ from unmerged
only at a near-tie (both picks in each other's top 5, the unmerged gap below the bound), judged
at the first differing position; a real wrong-weights divergence still fails."""

from __future__ import annotations

import pytest
import torch

from loraplex.bench.modes.parity import (
    ParityReport,
    ParityRule,
    ProbeMismatchError,
    StepTop,
    first_divergence,
    step_tops,
)
from loraplex.bench.modes.setup import NUM_ADAPTERS, ModesBenchConfig, Setup, probes
from loraplex.model.merge import MergedLoraApplier, negated, slot_weights

BF16 = ParityRule.for_dtype("bfloat16")
TOP = ((7, -0.70), (9, -0.72), (3, -2.0), (4, -3.0), (5, -4.0))  # 7 and 9 nearly tied


def same(token: int) -> StepTop:
    return StepTop(token, ((token, -0.1), (1, -3.0), (2, -4.0), (3, -5.0), (4, -6.0)))


def test_identical_continuations_have_no_divergence() -> None:
    steps = [same(11), same(12)]
    assert first_divergence(steps, list(steps), BF16) is None
    assert first_divergence(steps, list(steps), ParityRule(exact=True)) is None


def test_a_near_tie_passes_in_bfloat16_and_later_positions_are_not_compared() -> None:
    unmerged = [same(11), StepTop(7, TOP), same(30)]
    merged = [same(11), StepTop(9, ((9, -0.69), (7, -0.71), *TOP[2:])), same(40)]
    got = first_divergence(unmerged, merged, BF16)
    assert got is not None and got.near_tie
    assert (got.position, got.unmerged_token, got.merged_token) == (1, 7, 9)
    assert got.gap_nats == pytest.approx(0.02)
    strict = first_divergence(unmerged, merged, ParityRule(exact=True))  # float32: any token
    assert strict is not None and not strict.near_tie


def test_a_wide_gap_or_a_pick_outside_the_top_k_fails() -> None:
    wide = StepTop(7, ((7, -0.1), (9, -0.1 - 2 * BF16.max_gap_nats), *TOP[2:]))
    merged = StepTop(9, ((9, -0.5), (7, -0.6), *TOP[2:]))
    got = first_divergence([wide], [merged], BF16)
    assert got is not None and not got.near_tie and got.gap_nats is not None
    outside = StepTop(8, ((8, -0.5), *TOP[2:], (6, -5.0)))  # 7 not in the merged side's top 5
    got = first_divergence([StepTop(7, TOP)], [outside], BF16)
    assert got is not None and not got.near_tie and got.gap_nats is None


def test_the_rule_per_dtype_and_its_bounds() -> None:
    assert ParityRule.for_dtype("float32").exact
    assert not ParityRule.for_dtype("float16").exact and not BF16.exact
    with pytest.raises(ValueError, match="top_k 6"):
        ParityRule(exact=False, top_k=6)
    with pytest.raises(ValueError, match="max_gap_nats -1"):
        ParityRule(exact=False, max_gap_nats=-1)


def test_step_tops_pick_the_argmax_and_report_logprobs() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0, -1.0, 0.5]])
    (top,) = step_tops(logits)
    assert top.token == 1 and [t for t, _ in top.top] == [1, 3, 2, 5, 0]
    assert top.top[0][1] == pytest.approx(float(torch.log_softmax(logits, -1)[0, 1]))


@pytest.fixture(scope="module")
def bf16(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    config = ModesBenchConfig(dtype="bfloat16", probe_tokens=3, batch_size=4, context_tokens=8)
    return Setup(tmp_path_factory.mktemp("bf16"), config)


def test_bfloat16_probes_pass_with_their_near_ties_reported(bf16: Setup) -> None:
    """The random model's near-flat logits flip a greedy pick between merged and unmerged in
    bfloat16 (docs/modes.md); the rule accepts it and the report names it."""
    report = ParityReport(BF16)
    with torch.no_grad():
        probes(bf16, report)
    assert report.compared == 1 + 2 * NUM_ADAPTERS
    described = report.describe()
    assert described["num_divergences"] == len(report.accepted) >= 1
    for _, divergence in report.accepted:
        assert divergence.gap_nats is not None and divergence.gap_nats < BF16.max_gap_nats


def test_bfloat16_probes_fail_a_merge_of_the_wrong_adapter(
    bf16: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    def wrong(slot: int) -> MergedLoraApplier:  # folds in the next slot's adapter instead
        weights = slot_weights(bf16.pool, (slot + 1) % NUM_ADAPTERS)
        bf16.negative.load(0, negated(weights))
        bf16.merger.merge(weights)
        return MergedLoraApplier(bf16.pool, slot, bf16.negative)

    monkeypatch.setattr(bf16, "merge", wrong)
    with torch.no_grad(), pytest.raises(ProbeMismatchError, match="first difference at"):
        probes(bf16, ParityReport(BF16))
    assert bf16.merger.merged_digest is None  # the failed probe unmerged on its way out
