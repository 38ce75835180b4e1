"""Incremental detokenization (``IncrementalText``) equals a whole decode after every token, and
``OutputTracker`` streams the same deltas as with whole decodes, on random token sequences of the
demo tokenizer (byte tokens that are part of a UTF-8 character, special tokens, multi-byte text)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from loraplex.engine.output import IncrementalText, OutputTracker
from loraplex.model.tokenizer import TextTokenizer
from loraplex.sampling import SamplingParams

MODEL = Path(".loraplex-assets/test-small/models/loraplex-demo-small")


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    if not MODEL.is_dir():
        pytest.skip(f"{MODEL} not present")
    return TextTokenizer(MODEL)


class Whole:
    """The tokenizer decoded whole every token (the tracker's behaviour before incremental)."""

    rewrites_text = True

    def __init__(self, tok: TextTokenizer) -> None:
        self._tok = tok

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._tok.decode(token_ids)


def _sequences(tok: TextTokenizer, count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    vocab = 600
    partial = [i for i in range(vocab) if "\ufffd" in tok.decode([i])]
    special = [0, 1, 2, 3, 4]
    text_ids = tok.encode("héllo wörld — 日本語 😀 ok. ¿qué? " * 4)
    out = []
    for _ in range(count):
        n = rng.randint(1, 60)
        seq = []
        for _ in range(n):
            kind = rng.random()
            if kind < 0.35:
                seq.append(rng.choice(partial))
            elif kind < 0.45:
                seq.append(rng.choice(special))
            elif kind < 0.7:
                seq.append(rng.choice(text_ids))
            else:
                seq.append(rng.randrange(vocab))
        out.append(seq)
    return out


def test_partial_utf8_tokens_exist(tok: TextTokenizer) -> None:
    assert sum("\ufffd" in tok.decode([i]) for i in range(600)) > 50


def test_incremental_text_equals_whole_decode_after_every_token(tok: TextTokenizer) -> None:
    for seq in _sequences(tok, 1500, seed=1):
        text = IncrementalText(tok)
        for k, token in enumerate(seq, 1):
            assert text.append(token) == tok.decode(seq[:k]), seq[:k]


def test_tracker_deltas_match_whole_decodes(tok: TextTokenizer) -> None:
    rng = random.Random(2)
    for seq in _sequences(tok, 800, seed=3):
        full = tok.decode(seq)
        stops: tuple[str, ...] = ()
        if full and rng.random() < 0.6:
            i = rng.randrange(len(full))
            stops = (full[i : i + rng.randint(1, 4)],)
        params = SamplingParams(
            max_tokens=len(seq) + rng.randint(0, 2),
            stop=stops,
            min_tokens=min(len(seq), rng.choice([0, 0, 3])),
            include_stop_str_in_output=rng.random() < 0.5,
            stop_token_ids=(rng.choice(seq),) if rng.random() < 0.2 else (),
        )
        eos = frozenset({2})
        got = OutputTracker(params, 4, eos, tok)
        want = OutputTracker(params, 4, eos, Whole(tok))
        for token in seq:
            a, b = got.append(token), want.append(token)
            assert a == b, (seq, stops)
            if a.finish_reason is not None:
                break
        assert got.emitted == want.emitted


class DropsLeadingSpace:
    """Token i is chr(i), minus a leading space of the whole text (as a SentencePiece decoder
    drops the first token's space): a window without context would lose a space."""

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(chr(t) for t in token_ids).removeprefix(" ")


def test_decoder_that_rewrites_its_window_start_still_matches() -> None:
    rng = random.Random(4)
    det = DropsLeadingSpace()
    for _ in range(300):
        seq = [rng.choice([32, 97, 98]) for _ in range(rng.randint(1, 30))]
        text = IncrementalText(det)
        for k, token in enumerate(seq, 1):
            assert text.append(token) == det.decode(seq[:k]), seq[:k]


def test_clean_up_tokenizer_is_decoded_whole(tok: TextTokenizer) -> None:
    assert tok.rewrites_text is False
    tok._clean_up = True  # type: ignore[misc]  # the module's fixture; restored below
    try:
        assert tok.rewrites_text is True
        seq = tok.encode("a , b . c")
        text = IncrementalText(tok)
        for k, token in enumerate(seq, 1):
            assert text.append(token) == tok.decode(seq[:k])
    finally:
        tok._clean_up = False  # type: ignore[misc]


class ByteTokens:
    """Token i < 256 is byte i, 256 a special token decoded to nothing (skipped), decoded as
    Hugging Face decodes bytes (``errors='replace'``); ``decoded`` counts the token ids it was
    given, the work a decode costs."""

    def __init__(self) -> None:
        self.decoded = 0

    def decode(self, token_ids: Sequence[int]) -> str:
        self.decoded += len(token_ids)
        return bytes(t for t in token_ids if t < 256).decode("utf-8", errors="replace")


def test_a_run_that_never_completes_a_character_keeps_the_window_bounded() -> None:
    """10,000 lone continuation bytes (an adapter can emit them): each step decoded the whole
    run (its text ends in a replacement character throughout), 50 million token decodes; now the
    run is committed as it decodes, its replacement characters final, and the stream flows."""
    det = ByteTokens()
    run = [0x80] * 10_000
    tracker = OutputTracker(SamplingParams(max_tokens=20_000), 4, frozenset(), det)
    for token in run:
        tracker.append(token)
    assert tracker._text.text == "\ufffd" * len(run)  # the whole decode
    assert det.decoded <= 40 * len(run), det.decoded  # O(n): bounded work per token
    assert len(tracker.emitted) >= len(run) - 16  # streamed, not held back until the run ends
    tracker.append(ord("a"))
    assert tracker.emitted == "\ufffd" * len(run) + "a"


def _byte_runs(rng: random.Random) -> list[int]:
    """Bytes in runs: continuation bytes, lead bytes, ASCII, whole characters, and a character
    cut by a run (a lead byte, continuations, another lead byte...)."""
    pieces: list[bytes] = []
    for _ in range(rng.randint(1, 12)):
        kind = rng.random()
        if kind < 0.3:
            pieces.append(bytes([rng.randint(0x80, 0xBF)]) * rng.randint(1, 60))
        elif kind < 0.5:
            pieces.append(bytes(rng.choice([0xC3, 0xE2, 0xF0, 0x80, 0xBF]) for _ in range(30)))
        elif kind < 0.7:
            pieces.append(rng.choice(["é", "—", "日本", "😀", "a b", "\ufffd"]).encode())
        elif kind < 0.85:
            pieces.append(rng.choice(["😀", "€"]).encode()[: rng.randint(1, 3)])
        else:
            pieces.append(bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 40))))
    return list(b"".join(pieces))


def test_committed_runs_still_equal_the_whole_decode_of_byte_tokens() -> None:
    """A run is committed only where the tokens after it cannot change its text: byte tokens
    decode as a whole decode after every token, runs of any length included."""
    rng = random.Random(5)
    det = ByteTokens()
    for _ in range(300):
        seq = _byte_runs(rng)
        text = IncrementalText(det)
        for k, token in enumerate(seq, 1):
            assert text.append(token) == det.decode(seq[:k]), bytes(seq[:k])


def test_tokens_without_bytes_inside_a_run_keep_it_bounded() -> None:
    """Special tokens (decoded to nothing) between the bytes of a run: bounded all the same (a
    character they cut may become replacements, as the rule says)."""
    det = ByteTokens()
    run = [0x80, 256, 256, 0xF0, 256, 0x9F, 256, 256] * 1_500  # F0 9F 80: never complete
    text = IncrementalText(det)
    for token in run:
        text.append(token)
    assert det.decoded <= 40 * len(run), det.decoded
    assert set(text.text) == {"\ufffd"}
