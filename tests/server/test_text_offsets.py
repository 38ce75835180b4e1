"""``text_offset`` indexes the returned ``text`` for tokenizers whose tokens do not decode alone
to what the text holds of them: byte tokens of a character split over several (an emoji is 4
byte tokens of a byte-level BPE) and a SentencePiece-like decode that drops a leading space
(docs/benchmarks/attack30.md). Non-streamed and streamed, with and without ``echo``."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from loraplex.engine.protocol import TokenDelta, TokenLogprob
from loraplex.server.choices import ChoiceOutput, Echo, Shape
from loraplex.server.logprobs_format import TokenStrings
from loraplex.server.protocol import RevisionInfo
from loraplex.server.responses import completion_choices
from loraplex.server.streaming import ChunkFormat, StreamChoices

BOS = 256  # a special token: decoding skips it


class ByteTokenizer:
    """One token per UTF-8 byte (a byte-level BPE with no merges), BOS skipped by decode."""

    def decode(self, token_ids: Sequence[int]) -> str:
        return bytes(t for t in token_ids if t < 256).decode("utf-8", errors="replace")

    def token_text(self, token_id: int) -> str:
        return "<bos>" if token_id == BOS else self.decode([token_id])


class WordTokenizer:
    """SentencePiece-like: ``▁word`` tokens whose decode drops the first one's leading space,
    so a token decoded alone is a character shorter than what the text holds of it."""

    words = ("▁hello", "▁big", "▁world")

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(self.words[t] for t in token_ids).replace("▁", " ").removeprefix(" ")

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id])


def _entries(ids: Sequence[int]) -> tuple[TokenLogprob, ...]:
    return tuple(TokenLogprob(token_id=t, logprob=-1.0, rank=1, top=()) for t in ids)


def _utf8(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def _check(text: str, tokens: list[str], offsets: list[int], pieces: list[str]) -> None:
    """Each token's offset is where its piece of the text starts (``pieces``: what the text
    holds of each token: a byte token of a split character, that character)."""
    assert len(offsets) == len(tokens) == len(pieces)
    for token, offset, piece in zip(tokens, offsets, pieces, strict=True):
        assert text[offset:].startswith(piece), (token, offset, text)
    assert offsets == sorted(offsets)


def _output(ids: list[int], text: str, prompt: list[int] | None) -> ChoiceOutput:
    out = ChoiceOutput()
    out.add(
        TokenDelta(
            token_ids=tuple(ids), text=text, finish_reason="length",
            prompt_tokens=len(prompt or ()), completion_tokens=len(ids),
            logprobs=_entries(ids),
            prompt_logprobs=(None, *_entries(prompt[1:])) if prompt else None,
        )
    )  # fmt: skip
    return out


def _streamed(
    strings: TokenStrings, ids: list[int], texts: list[str], echo: Echo | None, prompt: list[int]
) -> tuple[str, list[str], list[int]]:
    """The stream of one choice, one token a delta, joined: text, tokens, offsets."""
    fmt = ChunkFormat("r", 0, "m", RevisionInfo(revision=None, adapter_digest=None), False)
    choices = StreamChoices(fmt, 1, 0, strings, [echo] if echo else None)
    text, tokens, offsets = "", [], []
    for i, (token, piece) in enumerate(zip(ids, texts, strict=True)):
        delta = TokenDelta(
            token_ids=(token,), text=piece, finish_reason="length" if i == len(ids) - 1 else None,
            prompt_tokens=len(prompt), completion_tokens=i + 1, logprobs=_entries([token]),
            prompt_logprobs=(None, *_entries(prompt[1:])) if echo and i == 0 else None,
        )  # fmt: skip
        event = choices.event(0, delta)
        assert event is not None
        choice = json.loads(event.removeprefix("data: "))["choices"][0]
        text += choice["text"]
        tokens += choice["logprobs"]["tokens"]
        offsets += choice["logprobs"]["text_offset"]
    return text, tokens, offsets


@pytest.mark.parametrize("echoed", [False, True])
def test_byte_tokens_of_a_split_character_point_at_it(echoed: bool) -> None:
    """On main every byte token of the emoji advanced the offset by one U+FFFD: each offset
    after it was 3 past its token (``b`` at 5 in ``a😀b``)."""
    strings = TokenStrings(ByteTokenizer())  # type: ignore[arg-type]
    prompt_text, out_text = "a😀b", "é!"
    prompt = [BOS, *_utf8(prompt_text)]
    ids = _utf8(out_text)
    echo = Echo(prompt_text, BOS) if echoed else None
    # What the text holds of each token: the character its bytes are part of.
    prompt_pieces = ["", "a", "😀", "😀", "😀", "😀", "b"] if echoed else []
    pieces = [*prompt_pieces, "é", "é", "!"]
    shape = Shape(num_prompts=1, n=1, best_of=1)
    (choice,) = completion_choices(
        [_output(ids, out_text, prompt if echoed else None)], shape, 0,
        [echo] if echo else None, strings,
    )  # fmt: skip
    assert choice.logprobs is not None
    logprobs = choice.logprobs
    assert logprobs.tokens is not None and logprobs.text_offset is not None
    _check(choice.text, logprobs.tokens, logprobs.text_offset, pieces)
    expected = [0, 0, 1, 1, 1, 1, 2, 3, 3, 4] if echoed else [0, 0, 1]
    assert logprobs.text_offset == expected

    texts = ["", "é", "!"]  # the engine holds back the incomplete character
    text, tokens, offsets = _streamed(strings, ids, texts, echo, prompt)
    assert (text, tokens, offsets) == (choice.text, logprobs.tokens, logprobs.text_offset)


def test_a_byte_no_later_byte_completes_is_text_the_next_token_follows() -> None:
    """A lead byte followed by ``!`` decodes to U+FFFD then ``!``: ``!`` starts after it, though
    the U+FFFD was still incomplete before ``!`` came."""
    strings = TokenStrings(ByteTokenizer())  # type: ignore[arg-type]
    ids = [0xE2, ord("!"), 0xF0, 0x9F, ord("?")]
    out_text = "\ufffd!\ufffd?"
    shape = Shape(num_prompts=1, n=1, best_of=1)
    (choice,) = completion_choices([_output(ids, out_text, None)], shape, 0, None, strings)
    assert choice.logprobs is not None and choice.logprobs.text_offset == [0, 1, 2, 2, 3]
    texts = ["", "\ufffd!", "", "", "\ufffd?"]
    text, _, offsets = _streamed(strings, ids, texts, None, [BOS])
    assert (text, offsets) == (out_text, [0, 1, 2, 2, 3])


def test_a_leading_space_a_token_drops_alone_still_counts() -> None:
    """A SentencePiece decode of ``▁big`` alone is ``big``: on main each word after the first
    put the offsets one more character before their tokens."""
    strings = TokenStrings(WordTokenizer())  # type: ignore[arg-type]
    ids = [0, 1, 2]
    out_text = "hello big world"
    shape = Shape(num_prompts=1, n=1, best_of=1)
    (choice,) = completion_choices([_output(ids, out_text, None)], shape, 0, None, strings)
    assert choice.logprobs is not None and choice.logprobs.text_offset == [0, 5, 9]
    text, _, offsets = _streamed(strings, ids, ["hello", " big", " world"], None, [BOS])
    assert (text, offsets) == (out_text, [0, 5, 9])
