"""No single caller decides a release: which callers a canary step's figures leave out.

A revision under release may be another tenant's public adapter, and every tenant that calls it
is one caller (``traffic.caller_key``). A caller can push a figure either way: fail or slow its
own requests (long prompts, sent on the sticky keys its answers showed on the candidate) to roll
a good candidate back, or flood it with fast, successful, praised requests to hide the owner's
users' failures and have a bad candidate promoted. So each figure is judged without the caller
that pushes it most towards a breach and without the one that pushes it most away from one:

- error rate: without the caller with the most failures, then the one with the most successes;
- feedback: without the caller with the most bad ratings, then the one with the most good ones;
- P99 latency: without the caller whose absence lowers the P99 most, then the one whose absence
  raises it most (each only when it moves the figure), on each side of the comparison.

Torch-free; a window's judgement walks at most the slowest 1 % of its samples per caller
considered, and only callers holding some of them (plus the largest other) are considered.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from operator import itemgetter

P99 = 0.99


@dataclass(frozen=True)
class LeftOut:
    """One caller's part of a window, left out of what is judged."""

    events: int = 0  # its requests (or ratings)
    failures: int = 0  # of which failed (or rated bad)


def extremes(events: Iterable[tuple[str, bool]]) -> tuple[LeftOut, LeftOut]:
    """(the caller with the most failures, then of the rest the one with the most successes),
    from ``(caller, failed)`` events; an empty ``LeftOut`` where there is none (no failure, or
    no success among the rest)."""
    counts: dict[str, list[int]] = {}
    for caller, failed in events:
        count = counts.setdefault(caller, [0, 0])
        count[0] += 1
        count[1] += failed
    ranked = sorted(counts.items(), key=lambda item: (-item[1][1], -item[1][0], item[0]))
    worst = ranked[0] if ranked and ranked[0][1][1] else None
    rest = [item for item in ranked if item is not worst]
    # the most successes; ties: the fewest failures, then the name
    best = min(rest, key=lambda item: (item[1][1] - item[1][0], item[1][1], item[0]), default=None)
    if best is not None and best[1][0] == best[1][1]:
        best = None  # nothing but failures: no success to hide anything
    return _left_out(worst), _left_out(best)


def _left_out(item: tuple[str, list[int]] | None) -> LeftOut:
    return LeftOut() if item is None else LeftOut(item[1][0], item[1][1])


def p99_without_extremes(samples: list[tuple[float, str]]) -> tuple[float | None, int]:
    """(nearest-rank P99, samples behind it) of ``(value, caller)`` samples without the caller
    whose absence lowers the P99 most and then the one whose absence raises it most."""
    ranked = _Ranked(samples)
    left_out: set[str] = set()
    for lower in (True, False):
        current = ranked.p99(left_out)[0]
        best: tuple[float, str] | None = None
        for caller in ranked.candidates(left_out, lower):
            value = ranked.p99(left_out | {caller})[0]
            if not _moves(current, value, lower):
                continue
            key = -1.0 if value is None else (value if lower else -value)
            if best is None or (key, caller) < best:
                best = (key, caller)
        if best is not None:
            left_out.add(best[1])
    return ranked.p99(left_out)


def _moves(before: float | None, after: float | None, lower: bool) -> bool:
    """Whether leaving a caller out moves the P99 from ``before`` to ``after`` that way (to
    nothing counts: no sample is left to judge)."""
    if before is None or after is None:
        return True
    return after < before if lower else after > before


def _above(num_samples: int) -> int:
    """Samples ranked above the nearest-rank P99 of ``num_samples``."""
    return num_samples - max(1, int(-(-num_samples * P99 // 1)))  # as ``traffic.percentile``


class _Ranked:
    """Samples slowest first, with each caller's positions among them: the P99 without a few
    callers costs a walk over their samples above it only."""

    def __init__(self, samples: list[tuple[float, str]]) -> None:
        ordered = sorted(samples, key=itemgetter(0), reverse=True)
        self.values = [value for value, _ in ordered]
        self.callers = [caller for _, caller in ordered]
        self.positions: dict[str, list[int]] = {}
        for position, caller in enumerate(self.callers):
            self.positions.setdefault(caller, []).append(position)

    def p99(self, left_out: set[str]) -> tuple[float | None, int]:
        remaining = len(self.values) - sum(len(self.positions[c]) for c in left_out)
        if remaining <= 0:
            return None, 0
        index = _above(remaining)  # among the rest; each left-out sample up to it shifts it
        for position in heapq.merge(*(self.positions[c] for c in left_out)):
            if position > index:
                break
            index += 1
        return self.values[index], remaining

    def candidates(self, left_out: set[str], lower: bool) -> set[str]:
        """The callers whose absence can move the P99 that way: those holding one of the
        samples at or above it (the only ones that can lower it), and to raise it also the
        largest other one (leaving out a caller with no sample up there moves the P99 up by its
        count alone, the more the larger it is)."""
        above = _above(len(self.values) - sum(len(self.positions[c]) for c in left_out))
        found: set[str] = set()
        seen = 0
        for caller in self.callers:
            if seen > above:
                break
            if caller in left_out:
                continue
            found.add(caller)
            seen += 1
        if not lower:
            others = [c for c in self.positions if c not in left_out and c not in found]
            if others:
                found.add(max(others, key=lambda c: (len(self.positions[c]), c)))
        return found
