from __future__ import annotations

from collections.abc import Sequence

from loraplex.engine.output import OutputTracker
from loraplex.engine.protocol import FINISH_LENGTH, FINISH_STOP
from loraplex.sampling import SamplingParams

EOS = 0


class Chars:
    """Token i is chr(i); 0 is EOS (skipped); 1 decodes to half a character (U+FFFD) unless
    followed by 2, which completes it."""

    def decode(self, token_ids: Sequence[int]) -> str:
        text = "".join(chr(t) for t in token_ids if t != EOS)
        return text.replace("\x01\x02", "é").replace("\x01", "\ufffd").replace("\x02", "")


def _run(tokens: list[int], **params: object) -> tuple[list[str], str | None]:
    tracker = OutputTracker(SamplingParams(**params), 3, frozenset({EOS}), Chars())  # type: ignore[arg-type]
    texts, reason = [], None
    for token in tokens:
        delta = tracker.append(token)
        texts.append(delta.text)
        reason = delta.finish_reason
        if reason is not None:
            break
    return texts, reason


def test_plain_text_streams_token_by_token_and_ends_at_eos() -> None:
    texts, reason = _run([ord(c) for c in "abc"] + [EOS], max_tokens=10)
    assert texts == ["a", "b", "c", ""] and reason == FINISH_STOP


def test_incomplete_character_is_held_back() -> None:
    texts, _ = _run([ord("a"), 1, 2, ord("b")], max_tokens=4)
    assert texts == ["a", "", "é", "b"]


def test_stop_string_prefix_is_held_then_cut() -> None:
    texts, reason = _run([ord(c) for c in "hi ENDx"], max_tokens=20, stop=("END",))
    assert "".join(texts) == "hi " and reason == FINISH_STOP
    assert texts[3] == "" and texts[4] == ""  # "E", "EN" could start the stop string


def test_false_stop_prefix_is_released_and_length_finishes() -> None:
    texts, reason = _run([ord(c) for c in "aEb"], max_tokens=3, stop=("END",))
    assert texts == ["a", "", "Eb"] and reason == FINISH_LENGTH


def test_min_tokens_keeps_generating_past_eos() -> None:
    texts, reason = _run([ord("a"), EOS, ord("b"), EOS], max_tokens=10, min_tokens=3)
    assert texts == ["a", "", "b", ""] and reason == FINISH_STOP


def test_min_tokens_ignores_stop_strings_that_end_before_it() -> None:
    tokens = [ord(c) for c in "aENDbEND"]
    texts, reason = _run(tokens, max_tokens=20, stop=("END",), min_tokens=5)
    assert "".join(texts) == "aENDb" and reason == FINISH_STOP


def test_stop_string_that_ends_at_min_tokens_cuts() -> None:
    texts, reason = _run([ord(c) for c in "xENDy"], max_tokens=20, stop=("END",), min_tokens=4)
    assert "".join(texts) == "x" and reason == FINISH_STOP and len(texts) == 4


def test_min_tokens_equal_to_max_tokens_finishes_by_length() -> None:
    texts, reason = _run([ord("a"), EOS, ord("b")], max_tokens=3, min_tokens=3)
    assert "".join(texts) == "ab" and reason == FINISH_LENGTH


def test_min_tokens_above_max_tokens_is_rejected() -> None:
    import pytest

    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=2, min_tokens=3)
