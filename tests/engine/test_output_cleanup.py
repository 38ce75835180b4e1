"""A tokenizer whose decode cleans up spaces (transformers' ``clean_up_tokenization_spaces``,
set by e.g. Llama 3's ``tokenizer_config.json``): the answer streamed is the whole decode, and
text once sent is never rewritten (``CleanedText``). The tracker decoded such a tokenizer's
whole output every token and sent text as if it only grew; after the clean-up rewrote text
already sent (``there `` then ``,``), every later delta was empty: the rest of the answer, and of
its non-streamed text, was lost (docs/benchmarks/attack28.md)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loraplex.engine.output import CleanedText, OutputTracker
from loraplex.model.tokenizer import TextTokenizer, clean_up_cut, clean_up_tokenization
from loraplex.sampling import SamplingParams

MODEL = Path(".loraplex-assets/test-small/models/loraplex-demo-small")
TEXTS = (
    "Hello there , my friend . It is n't so",
    "a  ' s and b ' m , c 're ' ve ? ! .",
    "x , , , , y n ' t 's 've 're n't",
    "héllo wörld — 日本語 😀 ok . ¿qué ? ' ",
)


@pytest.fixture
def tok() -> Iterator[TextTokenizer]:
    if not MODEL.is_dir():
        pytest.skip(f"{MODEL} not present")
    tokenizer = TextTokenizer(MODEL)
    tokenizer._clean_up = True  # type: ignore[misc]  # as a config with the setting makes it
    yield tokenizer


def _streamed(tok: TextTokenizer, ids: list[int], params: SamplingParams) -> tuple[str, str]:
    tracker = OutputTracker(params, 1, frozenset(), tok)
    sent = ""
    for token in ids:
        delta = tracker.append(token)
        sent += delta.text
        if delta.finish_reason is not None:
            break
    return sent, tracker.emitted


def test_a_rewrite_of_sent_text_loses_nothing(tok: TextTokenizer) -> None:
    ids = tok.encode(TEXTS[0])[1:]
    assert tok.decode(ids) == "Hello there, my friend. It isn't so"
    sent, emitted = _streamed(tok, ids, SamplingParams(max_tokens=len(ids)))
    # main: "Hello there " (the space sent before "," was cleaned away, nothing more was sent)
    assert sent == emitted == tok.decode(ids)


def test_cleaned_text_is_the_whole_decode_and_its_final_part_never_changes(
    tok: TextTokenizer,
) -> None:
    rng = random.Random(5)
    pool = [i for text in TEXTS for i in tok.encode(text)[1:]]
    for _ in range(400):
        seq = [rng.choice(pool) if rng.random() < 0.8 else rng.randrange(600) for _ in range(40)]
        text = CleanedText(tok)
        finals = []
        for k, token in enumerate(seq, 1):
            assert text.append(token) == tok.decode(seq[:k]), seq[:k]
            finals.append(text.text[: text.final_chars])
        whole = tok.decode(seq)
        assert all(whole.startswith(final) for final in finals), seq
        sent, _ = _streamed(tok, seq, SamplingParams(max_tokens=len(seq)))
        assert sent == whole, seq


def test_stop_strings_end_the_cleaned_text(tok: TextTokenizer) -> None:
    ids = tok.encode(TEXTS[0])[1:]
    sent, _ = _streamed(tok, ids, SamplingParams(max_tokens=len(ids), stop=("friend.",)))
    assert sent == "Hello there, my "


@settings(max_examples=1000, deadline=None)
@given(st.text(alphabet=" .?!,'ntmsvera\n", max_size=24), st.text(alphabet=" .?!,'ntmsvera\n",
       max_size=24))  # fmt: skip
def test_clean_up_applies_in_pieces_where_it_may_be_cut(left: str, right: str) -> None:
    if left and right and clean_up_cut(left[-1], right[0]):
        assert clean_up_tokenization(left + right) == (
            clean_up_tokenization(left) + clean_up_tokenization(right)
        )
