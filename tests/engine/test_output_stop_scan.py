"""OutputTracker's stop-string search is incremental: each token searches only where a match
could end in text new since the last token (``StopScan``), with the same answer as a search of
the whole text from the ``min_tokens`` floor.

- ``test_incremental_search_equals_the_full_search_at_every_step``: hypothesis grows a text by
  extensions and rewrites of its tail (a decoder replacing a trailing replacement character,
  a clean-up rewriting its pending piece) and compares every step with the full search.
- ``test_a_token_searches_a_bounded_span_whatever_the_output_length``: the characters that
  ``str.find`` is asked to search per token do not grow with the output (counted, not timed).
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from loraplex.engine.output import OutputTracker
from loraplex.engine.stop_scan import StopScan
from loraplex.sampling import SamplingParams


def full_search(text: str, stops: tuple[str, ...], floor: int) -> tuple[int, str] | None:
    """The reference (the search before ``StopScan``): every stop string from the floor."""
    found = ((text.find(s, max(0, floor - len(s) + 1)), s) for s in stops)
    return min(((i, s) for i, s in found if i >= 0), key=lambda m: m[0], default=None)


ALPHABET = "ab\ufffd"
STEP = st.tuples(
    st.integers(min_value=0, max_value=4) | st.integers(min_value=0, max_value=80),
    st.text(ALPHABET, max_size=4) | st.text(ALPHABET, max_size=40),
)


@settings(max_examples=400, deadline=None)
@given(
    stops=st.lists(st.text(ALPHABET, min_size=1, max_size=4), min_size=1, max_size=4),
    floor=st.integers(min_value=0, max_value=6),
    steps=st.lists(STEP, max_size=30),
)
def test_incremental_search_equals_the_full_search_at_every_step(
    stops: list[str], floor: int, steps: list[tuple[int, str]]
) -> None:
    """Each step drops ``cut`` characters off the end (0: the text only grows) and adds some."""
    scan, text = StopScan(tuple(stops)), ""
    for cut, added in steps:
        text = text[: max(0, len(text) - cut)] + added
        assert scan.match(text, floor) == full_search(text, tuple(stops), floor), text


def test_a_rewrite_far_from_the_end_is_searched_again() -> None:
    """The last 64 characters unchanged, an earlier one rewritten: still the full answer."""
    scan = StopScan(("ab",))
    assert scan.match("x" * 100 + "a" + "y" * 100, 0) is None
    text = "x" * 100 + "ab" + "y" * 100
    assert scan.match(text, 0) == full_search(text, ("ab",), 0) == (100, "ab")


def test_a_floor_change_searches_again_from_the_new_floor() -> None:
    scan = StopScan(("ab",))
    assert scan.match("xxab", 4) is None
    assert scan.match("xxabx", 0) == (2, "ab")


class Counted(str):
    """A text that adds up the characters each ``find`` is asked to search."""

    searched = 0

    def find(self, sub: str, start: int | None = None, end: int | None = None) -> int:  # type: ignore[override]
        lo = 0 if start is None else start
        hi = len(self) if end is None else min(end, len(self))
        Counted.searched += max(0, hi - lo)
        return str.find(self, sub, start, end)


class WholeDecode:
    """Every token decodes to 16 characters; decoded whole each time (``rewrites_text``), so
    the tracker searches the very string ``decode`` returns."""

    rewrites_text = True

    def decode(self, token_ids: Sequence[int]) -> str:
        return Counted("abcdefghijklmno " * len(token_ids))


def _searched(num_tokens: int) -> int:
    stops = ("zz", "yyyy", "xx" * 8, "\u2042" + "w" * 63)
    tracker = OutputTracker(
        SamplingParams(max_tokens=num_tokens + 1, stop=stops), 1, frozenset(), WholeDecode()
    )
    Counted.searched = 0
    for _ in range(num_tokens):
        assert tracker.append(1).finish_reason is None
    return Counted.searched


def test_a_token_searches_a_bounded_span_whatever_the_output_length() -> None:
    short, long = _searched(64), _searched(1024)
    # per token: each stop string's new text plus its length less one, whatever came before
    # NOTE: every stop string was searched from the floor on every token: 16x per token here
    assert long / 1024 < 1.5 * short / 64, (short, long)
    assert long <= 1024 * 4 * (16 + 63), long
