"""release/callers.py: which callers a step's figures leave out. The P99 without the extreme
callers is checked against a brute force over every caller (the pruned search considers only
the callers that can move the figure)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from loraplex.release.callers import LeftOut, extremes, p99_without_extremes
from loraplex.release.traffic import percentile


def _p99_without(samples: list[tuple[float, str]], left_out: set[str]) -> float | None:
    return percentile([value for value, caller in samples if caller not in left_out], 0.99)


def _brute_force(samples: list[tuple[float, str]]) -> tuple[float | None, int]:
    left_out: set[str] = set()
    callers = sorted({caller for _, caller in samples})
    for lower in (True, False):
        current = _p99_without(samples, left_out)
        best: tuple[float, str] | None = None
        for caller in callers:
            if caller in left_out:
                continue
            value = _p99_without(samples, left_out | {caller})
            if value is None or current is None:
                moved = True  # nothing left to judge
            else:
                moved = value < current if lower else value > current
            if not moved:
                continue
            key = -1.0 if value is None else (value if lower else -value)
            if best is None or (key, caller) < best:
                best = (key, caller)
        if best is not None:
            left_out.add(best[1])
    rest = [value for value, caller in samples if caller not in left_out]
    return percentile(rest, 0.99), len(rest)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 40).map(lambda v: v / 10), st.sampled_from("abcdefgh")),
        max_size=400,
    )
)
def test_p99_without_extremes_matches_a_brute_force(samples: list[tuple[float, str]]) -> None:
    assert p99_without_extremes(samples) == _brute_force(samples)


def test_p99_leaves_out_a_slow_tail_and_a_fast_flood() -> None:
    honest = [(0.1 + 0.001 * i, f"user-{i}") for i in range(200)]
    slow = [(5.0, "tenant:acme")] * 10
    values = [value for value, _ in honest]
    # the slow tail's caller goes, then the one whose absence raises the P99 (a fast user)
    assert p99_without_extremes(honest + slow) == (percentile(values[1:], 0.99), 199)
    fast = [(0.001, "tenant:acme")] * 5000
    # no one user's absence lowers the P99 (the next one up takes its rank); the flood goes
    assert p99_without_extremes(honest + fast) == (percentile(values, 0.99), 200)


def test_extremes_names_the_worst_then_the_best_of_the_rest() -> None:
    events = [("a", True)] * 3 + [("a", False)] + [("b", False)] * 5 + [("c", True), ("c", False)]
    assert extremes(events) == (LeftOut(4, 3), LeftOut(5, 0))
    assert extremes([("a", False)] * 2) == (LeftOut(), LeftOut(2, 0))
    assert extremes([("a", True)] * 2) == (LeftOut(2, 2), LeftOut())
    assert extremes([]) == (LeftOut(), LeftOut())
