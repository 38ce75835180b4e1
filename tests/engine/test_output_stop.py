"""OutputTracker: stop token ids, include_stop_str_in_output and stop_reason (vLLM's rules)."""

from __future__ import annotations

from collections.abc import Sequence

from loraplex.engine.output import OutputTracker
from loraplex.engine.protocol import FINISH_LENGTH, FINISH_STOP, TokenDelta
from loraplex.sampling import SamplingParams

EOS = 0


class Chars:
    """Token i decodes to chr(i); 0 is EOS (skipped)."""

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(chr(t) for t in token_ids if t != EOS)


def run(text: str, **params: object) -> tuple[str, TokenDelta]:
    """Feed ``text`` character by character until the tracker finishes; (streamed, last)."""
    tracker = OutputTracker(SamplingParams(**params), 3, frozenset({EOS}), Chars())  # type: ignore[arg-type]
    streamed = ""
    for char in text:
        delta = tracker.append(ord(char) if char != "$" else EOS)
        streamed += delta.text
        if delta.finish_reason is not None:
            return streamed, delta
    raise AssertionError("the tracker did not finish")


def test_stop_token_id_ends_without_its_text_and_is_the_stop_reason() -> None:
    streamed, last = run("abcXdef", max_tokens=10, stop_token_ids=(ord("X"),))
    assert streamed == "abc"
    assert (last.finish_reason, last.stop_reason, last.completion_tokens) == (
        FINISH_STOP,
        ord("X"),
        4,
    )
    assert last.token_ids == (ord("X"),)


def test_stop_token_id_text_is_kept_with_include_stop_str_in_output() -> None:
    streamed, last = run(
        "abXd", max_tokens=10, stop_token_ids=(ord("X"),), include_stop_str_in_output=True
    )
    assert streamed == "abX" and last.stop_reason == ord("X")


def test_stop_token_id_is_honoured_with_ignore_eos_but_not_before_min_tokens() -> None:
    streamed, last = run("$aX", max_tokens=10, stop_token_ids=(ord("X"),), ignore_eos=True)
    assert streamed == "a" and last.stop_reason == ord("X")
    streamed, last = run("aXbX", max_tokens=10, stop_token_ids=(ord("X"),), min_tokens=3)
    assert streamed == "aXb" and last.completion_tokens == 4


def test_stop_string_is_the_stop_reason_and_kept_on_request() -> None:
    streamed, last = run("hello world", max_tokens=20, stop=("lo w", "xyz"))
    assert (streamed, last.stop_reason, last.finish_reason) == ("hel", "lo w", FINISH_STOP)
    streamed, last = run(
        "hello world", max_tokens=20, stop=("xyz", "lo w"), include_stop_str_in_output=True
    )
    assert (streamed, last.stop_reason) == ("hello w", "lo w")


def test_earliest_stop_string_wins() -> None:
    streamed, last = run("abcd", max_tokens=20, stop=("cd", "bcd"))
    assert (streamed, last.stop_reason) == ("a", "bcd")


def test_eos_and_length_have_no_stop_reason() -> None:
    streamed, last = run("ab$", max_tokens=20, stop_token_ids=(ord("z"),))
    assert (streamed, last.finish_reason, last.stop_reason) == ("ab", FINISH_STOP, None)
    streamed, last = run("abc", max_tokens=2)
    assert (streamed, last.finish_reason, last.stop_reason) == ("ab", FINISH_LENGTH, None)


def test_eos_listed_in_stop_token_ids_ends_with_a_null_stop_reason_as_vllm() -> None:
    # vLLM's check_stop tests EOS before stop_token_ids: EOS is never a stop reason
    streamed, last = run("ab$c", max_tokens=10, stop_token_ids=(EOS, ord("X")))
    assert (streamed, last.finish_reason, last.stop_reason) == ("ab", FINISH_STOP, None)
    # with ignore_eos, EOS is an ordinary token: listed, it is the stop reason
    streamed, last = run("ab$c", max_tokens=10, stop_token_ids=(EOS,), ignore_eos=True)
    assert (streamed, last.finish_reason, last.stop_reason) == ("ab", FINISH_STOP, EOS)
