"""OutputTracker's hold-back of a possible stop string costs work per new character, not per
character of the stop strings (attack12: a tenant's 4 x 1,024-character stop strings were each
rescanned prefix by prefix after every token, on the engine thread that steps every tenant).

The work is counted as Python lines run (``sys.settrace``), not timed."""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

from loraplex.engine.output import OutputTracker, StopHold
from loraplex.sampling import SamplingParams


class Words:
    """Every token decodes to the same 16 characters."""

    def decode(self, token_ids: Sequence[int]) -> str:
        return "abcdefghijklmno " * len(token_ids)


def _lines_run(stops: tuple[str, ...], num_tokens: int) -> int:
    """Python lines run while ``num_tokens`` tokens are appended (none of ``stops`` occurs in
    their text, so every token is held back against all of them)."""
    tracker = OutputTracker(
        SamplingParams(max_tokens=num_tokens + 1, stop=stops), 1, frozenset(), Words()
    )
    count = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        for _ in range(num_tokens):
            assert tracker.append(1).finish_reason is None
    finally:
        sys.settrace(None)
    return count


def test_hold_back_work_does_not_grow_with_the_stop_strings_length() -> None:
    short = _lines_run(tuple(f"{i}" + "z" * 63 for i in range(4)), 256)
    long = _lines_run(tuple(f"{i}" + "z" * 1023 for i in range(4)), 256)
    # NOTE: before, each token tried every prefix of every stop string: 16x the short case
    assert long < 2 * short, (short, long)


def _held(text: str, stops: tuple[str, ...]) -> int:
    """The reference: the longest proper prefix of any stop string that ``text`` ends with."""
    return max(
        (n for s in stops for n in range(1, len(s)) if text.endswith(s[:n])),
        default=0,
    )


def test_stop_hold_keeps_exactly_the_longest_stop_prefix_as_text_grows_or_changes() -> None:
    rng = random.Random(12)
    for _ in range(500):
        stops = tuple(
            "".join(rng.choice("ab") for _ in range(rng.randint(1, 6)))
            for _ in range(rng.randint(1, 4))
        )
        hold, text = StopHold(stops), ""
        for _ in range(16):
            if text and rng.random() < 0.2:  # the end rewritten (not an extension)
                text = text[: rng.randint(0, len(text))]
            text += "".join(rng.choice("abc\ufffd") for _ in range(rng.randint(0, 3)))
            settled = text.rstrip("\ufffd")
            expected = settled[: len(settled) - _held(settled, stops)]
            assert hold.settled(text) == expected, (stops, text)
