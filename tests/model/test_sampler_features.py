"""Logit bias, penalties, min-p, top-k, top-p and logprobs against a reference written here from
vLLM's definitions (plain Python over a tiny vocabulary), and the sampler's per-row contracts:
unprocessed rows are untouched, seeded rows draw the same tokens whatever shares the batch."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from loraplex.model.sampler import (
    RowHistory,
    filter_logits,
    make_generator,
    process_logits,
    sample_rows,
    token_logprobs,
)
from loraplex.sampling import SamplingParams

VOCAB = 8
CPU = torch.device("cpu")


# --- the reference ---


def ref_process(
    logits: list[float], p: SamplingParams, prompt: list[int], output: list[int]
) -> list[float]:
    """vLLM: bias, then repetition over prompt + output, then frequency/presence over output."""
    out = list(logits)
    for token, bias in p.logit_bias:
        out[token] += bias
    counts = Counter(output)
    for t in range(len(out)):
        if t in prompt or counts[t] > 0:
            rp = p.repetition_penalty
            out[t] = out[t] / rp if out[t] > 0 else out[t] * rp
        out[t] -= p.frequency_penalty * counts[t] + p.presence_penalty * (counts[t] > 0)
    return out


def ref_softmax(xs: list[float]) -> list[float]:
    top = max(xs)
    exps = [math.exp(x - top) if x != -math.inf else 0.0 for x in xs]
    return [e / sum(exps) for e in exps]


def ref_distribution(logits: list[float], p: SamplingParams) -> tuple[list[float], bool]:
    """Temperature, min-p, top-k, top-p; the final distribution and whether a token sits so
    close to a cut-off that float32 may decide it otherwise."""
    xs = [x / p.temperature for x in logits]
    kept = set(range(len(xs)))
    borderline = False
    if p.min_p > 0:
        probs = ref_softmax(xs)
        floor = p.min_p * max(probs)
        borderline |= any(abs(q - floor) < 1e-5 for q in probs)
        kept = {t for t in kept if probs[t] >= floor}
    ranked = sorted(kept, key=lambda t: -xs[t])
    if p.top_k is not None:
        kept = set(ranked[: p.top_k])
        borderline |= (
            len(ranked) > p.top_k and abs(xs[ranked[p.top_k]] - xs[ranked[p.top_k - 1]]) < 1e-4
        )
    if p.top_p < 1:
        ranked = sorted(kept, key=lambda t: -xs[t])
        probs = ref_softmax([xs[t] for t in ranked])
        above, keep = 0.0, set[int]()
        for t, q in zip(ranked, probs, strict=True):
            borderline |= abs(above - p.top_p) < 1e-4
            if above < p.top_p or not keep:
                keep.add(t)
            above += q
        kept = keep
    masked = [x if t in kept else -math.inf for t, x in enumerate(xs)]
    return ref_softmax(masked), borderline


# --- strategies ---

logit_values = st.lists(st.integers(-40, 40).map(lambda i: i / 8), min_size=VOCAB, max_size=VOCAB)
tokens = st.lists(st.integers(0, VOCAB - 1), max_size=6)
penalty = st.sampled_from([0.0, -2.0, -0.5, 0.7, 2.0])


@st.composite
def feature_params(draw: st.DrawFn, greedy: bool = False) -> SamplingParams:
    bias_ids = draw(st.lists(st.integers(0, VOCAB - 1), unique=True, max_size=3))
    return SamplingParams(
        temperature=0.0 if greedy else draw(st.sampled_from([0.5, 1.0, 1.7])),
        top_k=draw(st.sampled_from([None, 1, 3, 6])),
        top_p=draw(st.sampled_from([1.0, 0.9, 0.5])),
        min_p=draw(st.sampled_from([0.0, 0.05, 0.3])),
        presence_penalty=draw(penalty),
        frequency_penalty=draw(penalty),
        repetition_penalty=draw(st.sampled_from([1.0, 0.8, 1.3, 2.0])),
        logit_bias=tuple((t, draw(st.sampled_from([-100.0, -3.0, 2.5, 100.0]))) for t in bias_ids),
    )


# --- tests ---


@settings(max_examples=200, deadline=None)
@given(logit_values, feature_params(), tokens, tokens)
def test_distribution_matches_the_reference(
    logits: list[float], p: SamplingParams, prompt: list[int], output: list[int]
) -> None:
    expected_logits = ref_process(logits, p, prompt, output)
    expected, borderline = ref_distribution(expected_logits, p)
    assume(not borderline)
    history = RowHistory(prompt, output)
    processed = process_logits(torch.tensor(logits), p, history)
    assert processed.tolist() == pytest.approx(expected_logits, abs=1e-4)
    ours = filter_logits(processed, p).softmax(-1)
    assert ours.tolist() == pytest.approx(expected, abs=1e-5)


@settings(max_examples=200, deadline=None)
@given(logit_values, feature_params(greedy=True), tokens, tokens)
def test_greedy_takes_the_argmax_of_the_penalised_biased_logits(
    logits: list[float], p: SamplingParams, prompt: list[int], output: list[int]
) -> None:
    expected = ref_process(logits, p, prompt, output)
    best = max(expected)
    assume(sum(abs(x - best) < 1e-4 for x in expected) == 1)  # a unique argmax
    plain = SamplingParams()
    out = sample_rows(
        torch.tensor([logits, logits]),
        [p, plain],
        [None, None],
        histories=[RowHistory(prompt, output), None],
    )
    assert out.tokens[0] == expected.index(best)
    assert out.tokens[1] == max(range(VOCAB), key=lambda t: (logits[t], -t))  # untouched row


def test_repetition_penalty_reads_the_prompt_and_presence_only_the_output() -> None:
    logits = torch.tensor([2.0, -2.0, 2.0, 1.0])
    history = RowHistory(prompt=[0, 1], output=[3, 3])
    rep = process_logits(logits, SamplingParams(repetition_penalty=2.0), history)
    assert rep.tolist() == [1.0, -4.0, 2.0, 0.5]
    pres = process_logits(
        logits, SamplingParams(presence_penalty=1.0, frequency_penalty=0.5), history
    )
    assert pres.tolist() == [2.0, -2.0, 2.0, -1.0]  # 1 - 0.5 * 2 - 1


def test_a_bias_outside_the_vocabulary_fails_its_row_only() -> None:
    params = [SamplingParams(logit_bias=((VOCAB, 5.0),)), SamplingParams()]
    out = sample_rows(torch.zeros(2, VOCAB), params, [None, None])
    assert set(out.failures) == {0} and "logit_bias" in out.failures[0]
    assert out.tokens == {1: 0}


def test_penalty_without_history_fails_its_row() -> None:
    out = sample_rows(torch.zeros(1, VOCAB), [SamplingParams(presence_penalty=1.0)], [None])
    assert "history" in out.failures[0]


def test_seeded_rows_draw_the_same_whatever_shares_the_batch() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 50, generator=gen)
    seeded = SamplingParams(temperature=1.2, min_p=0.02, presence_penalty=0.5,
                            repetition_penalty=1.2, top_k=20, seed=11)  # fmt: skip
    others = [SamplingParams(), SamplingParams(temperature=0.8, seed=1, frequency_penalty=1.0)]
    history = RowHistory([1, 2, 3], [4, 4])

    alone = [sample_rows(logits[:1], [seeded], [g], histories=[history]).tokens[0]
             for g in [make_generator(seeded, CPU)] for _ in range(5)]  # fmt: skip
    gens = [make_generator(p, CPU) for p in [others[0], others[1], seeded]]
    batch = logits[[1, 2, 0]]
    together = [
        sample_rows(batch, [others[0], others[1], seeded], gens,
                    histories=[None, history, history]).tokens[2]
        for _ in range(5)
    ]  # fmt: skip
    assert together == alone
    assert len(set(alone)) > 1  # it really samples


def test_logprobs_are_raw_with_ranks_and_top_alternatives() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, 0.0, 5.0, 1.0]])
    params = [SamplingParams(logprobs=2, logit_bias=((3, 100.0),)), SamplingParams()]
    out = sample_rows(logits, params, [None, None])
    assert out.tokens == {0: 3, 1: 2} and set(out.logprobs) == {0}
    lp = out.logprobs[0]
    raw = torch.log_softmax(logits[0], -1)  # before the bias that picked token 3
    assert lp.token_id == 3 and lp.logprob == pytest.approx(float(raw[3]))
    assert lp.rank == 4
    assert [t for t, _ in lp.top] == [1, 2]
    assert [v for _, v in lp.top] == pytest.approx([float(raw[1]), float(raw[2])])


def test_token_logprobs_zero_top_and_ties_rank_below() -> None:
    found = token_logprobs(torch.tensor([[1.0, 1.0, 0.0]]), [1], [0])
    assert found[0].top == () and found[0].rank == 2  # a tie ranks below (vLLM counts >=)


def test_greedy_batch_without_features_is_untouched_by_a_featured_neighbour() -> None:
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(5))
    plain = [SamplingParams(), SamplingParams()]
    alone = sample_rows(logits[:2], plain, [None, None]).tokens
    featured = replace(SamplingParams(), logit_bias=((0, 100.0),), logprobs=3)
    mixed = sample_rows(logits, [*plain, featured], [None, None, None])
    assert {r: mixed.tokens[r] for r in (0, 1)} == alone
    assert mixed.tokens[2] == 0 and set(mixed.logprobs) == {2}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("presence_penalty", 2.5),
        ("frequency_penalty", -2.01),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", math.inf),
        ("min_p", 1.5),
        ("logit_bias", ((1, 101.0),)),
        ("logit_bias", ((-1, 1.0),)),
        ("logit_bias", tuple((i, 1.0) for i in range(301))),
        ("logit_bias", ((1, 1.0), (1, 2.0))),
        ("stop_token_ids", (-3,)),
        ("stop_token_ids", tuple(range(65))),
        ("logprobs", 21),
        ("logprobs", -1),
        ("prompt_logprobs", 21),
    ],
)
def test_invalid_feature_params_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


def test_feature_params_at_their_bounds_are_accepted() -> None:
    p = SamplingParams(presence_penalty=-2, frequency_penalty=2, repetition_penalty=0.01,
                       min_p=1.0, logit_bias=tuple((i, 100.0) for i in range(300)),
                       stop_token_ids=tuple(range(64)), logprobs=20, prompt_logprobs=0)  # fmt: skip
    assert p.processes_logits and p.penalized
    assert not SamplingParams(min_p=0.5).processes_logits  # greedy: min-p cannot change argmax


def test_a_row_whose_processing_yields_nan_fails_instead_of_picking_any_token() -> None:
    """Validation bounds the penalties, but the sampler must not trust that: a greedy argmax
    over NaN picks an arbitrary token and would report success."""
    broken = SamplingParams(repetition_penalty=2.0)
    object.__setattr__(broken, "repetition_penalty", 0.0)  # past validation: x / 0 is inf
    logits = torch.ones(2, VOCAB)
    history = RowHistory(prompt=(1, 2), output=())
    out = sample_rows(logits, [broken, SamplingParams()], [None, None], histories=[history, None])
    assert set(out.failures) == {0} and "non-finite" in out.failures[0]
    assert out.tokens == {1: 0}
    assert out.request_faults == {0}  # its own values broke it: not the model's fault


def test_non_finite_model_logits_are_the_models_fault_not_the_requests() -> None:
    logits = torch.zeros(2, VOCAB)
    logits[0, 3] = float("nan")
    out = sample_rows(logits, [SamplingParams(), SamplingParams()], [None, None])
    assert set(out.failures) == {0} and out.request_faults == set()
