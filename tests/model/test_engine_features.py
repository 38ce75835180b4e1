"""Sampling features through the serving engine (offline): stop token ids and stop reasons,
penalties and logit bias on real logits, seeded draws independent of the batch, requests
without features unaffected by neighbours that use them, out-of-vocabulary ids refused."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from tiny_models import save_tiny_model, save_word_tokenizer

from loraplex.engine.offline import OfflineConfig, OfflineEngine, OfflineRequest
from loraplex.errors import InvalidRequestError
from loraplex.sampling import SamplingParams

PROMPTS = ("w5 w17 w3 w40", "w8 w9", "w60 w61 w62 w63", "w11")
VOCAB = 97


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OfflineEngine]:
    base = save_tiny_model(tmp_path_factory.mktemp("feat") / "tiny", "llama", seed=2)
    save_word_tokenizer(base)
    with OfflineEngine(base, OfflineConfig()) as offline:
        yield offline


def greedy(max_tokens: int = 10, **kw: object) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kw)  # type: ignore[arg-type]


def test_stop_token_ids_end_generation_with_the_id_as_stop_reason(engine: OfflineEngine) -> None:
    free = engine.generate([OfflineRequest(PROMPTS[0], None, greedy())])[0]
    stop = free.token_ids[3]
    k = free.token_ids.index(stop)
    cut = engine.generate([OfflineRequest(PROMPTS[0], None, greedy(stop_token_ids=(stop,)))])[0]
    assert cut.token_ids == free.token_ids[: k + 1]
    assert (cut.finish_reason, cut.stop_reason) == ("stop", stop)
    assert cut.text == " ".join(f"w{t}" for t in free.token_ids[:k])
    kept = greedy(stop_token_ids=(stop,), include_stop_str_in_output=True)
    assert engine.generate([OfflineRequest(PROMPTS[0], None, kept)])[0].text.endswith(f"w{stop}")
    # min_tokens bans the stop id until it is reached (as vLLM), so the id cannot end it early.
    late = greedy(stop_token_ids=(stop,), min_tokens=k + 2)
    out = engine.generate([OfflineRequest(PROMPTS[0], None, late)])[0]
    assert stop not in out.token_ids[: k + 1] and len(out.token_ids) >= k + 2
    assert free.stop_reason is None and free.finish_reason == "length"


def test_stop_string_is_the_stop_reason(engine: OfflineEngine) -> None:
    free = engine.generate([OfflineRequest(PROMPTS[1], None, greedy())])[0]
    word = f"w{free.token_ids[2]}"
    out = engine.generate([OfflineRequest(PROMPTS[1], None, greedy(stop=(word,)))])[0]
    assert out.stop_reason == word and word not in out.text
    kept = greedy(stop=(word,), include_stop_str_in_output=True)
    assert engine.generate([OfflineRequest(PROMPTS[1], None, kept)])[0].text.endswith(word)


def test_logit_bias_and_penalties_change_greedy_tokens(engine: OfflineEngine) -> None:
    free = engine.generate([OfflineRequest(PROMPTS[2], None, greedy())])[0]
    forced = engine.generate([OfflineRequest(PROMPTS[2], None, greedy(logit_bias=((42, 100.0),)))])
    assert set(forced[0].token_ids) == {42}
    repeat = max(set(free.token_ids), key=free.token_ids.count)
    assert free.token_ids.count(repeat) > 1  # the tiny model repeats itself
    penalties = greedy(presence_penalty=2.0, frequency_penalty=2.0)
    penalised = engine.generate([OfflineRequest(PROMPTS[2], None, penalties)])
    assert len(set(penalised[0].token_ids)) > len(set(free.token_ids))


def test_a_mixed_batch_leaves_featureless_requests_as_they_are_alone(
    engine: OfflineEngine,
) -> None:
    plain = [OfflineRequest(p, None, greedy(12)) for p in PROMPTS[:2]]
    seeded = greedy(12, temperature=1.3, seed=5, min_p=0.05, top_k=30, presence_penalty=0.8,
                    repetition_penalty=1.3)  # fmt: skip
    featured = [
        OfflineRequest(PROMPTS[2], None, seeded),
        OfflineRequest(PROMPTS[3], None, greedy(12, logit_bias=((7, 3.0),), logprobs=2)),
    ]
    together = engine.generate([plain[0], *featured, plain[1]])
    assert [together[0], together[3]] == [engine.generate([r])[0] for r in plain]
    # The seeded, penalised request draws the same alone and among other neighbours.
    assert engine.generate([featured[0]])[0] == together[1]
    neighbour = OfflineRequest("w90 w91", None, SamplingParams(12, temperature=0.7, seed=1))
    assert engine.generate([neighbour, featured[0]])[1] == together[1]
    reseeded = engine.generate([replace(featured[0], params=replace(seeded, seed=6))])[0]
    assert reseeded.token_ids != together[1].token_ids


@pytest.mark.parametrize(
    ("field", "params"),
    [
        ("logit_bias", SamplingParams(logit_bias=((VOCAB, 1.0),))),
        ("stop_token_ids", SamplingParams(stop_token_ids=(5, VOCAB + 3))),
    ],
)
def test_token_ids_outside_the_vocabulary_are_refused(
    engine: OfflineEngine, field: str, params: SamplingParams
) -> None:
    with pytest.raises(InvalidRequestError, match=field) as info:
        engine.generate([OfflineRequest(PROMPTS[0], None, params)])
    assert info.value.param == field
    assert engine.core.scheduler.requests == {}  # nothing was queued
