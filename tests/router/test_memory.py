"""``DecisionMemory.withdraw``: a request routed again is pending on its last replica only;
``finish``: a request that ended is no longer load, its revision still named."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loraplex.router.memory import NO_PENDING, DecisionMemory, Entry, Pending


def test_a_withdrawn_decision_leaves_the_totals_and_a_lapsed_one_is_a_no_op() -> None:
    memory = DecisionMemory(ttl_s=1.0)
    first = memory.record("a", "rev", 10, at_s=0.0)
    memory.record("a", "rev", 5, at_s=0.0)  # an equal time and revision: another request
    memory.record("a", None, 3, at_s=0.5)
    assert memory.pending("a", None, 0.5) == Pending(3, 18, frozenset({"rev"}))
    memory.withdraw("a", first)
    assert memory.pending("a", None, 0.5) == Pending(2, 8, frozenset({"rev"}))
    memory.withdraw("a", first)  # already withdrawn: nothing else goes
    assert memory.pending("a", None, 0.5) == Pending(2, 8, frozenset({"rev"}))
    late = memory.record("b", "rev", 7, at_s=0.0)
    assert memory.pending("b", None, 2.0) == NO_PENDING  # lapsed by the TTL
    memory.withdraw("b", late)
    assert memory.pending("b", None, 2.0) == NO_PENDING
    left = memory.record("gone", "rev", 7, at_s=2.0)
    memory.forget_except({"a", "b"})  # a replica that left
    memory.withdraw("gone", left)
    back = memory.record("gone", "rev", 7, at_s=2.0)  # back under its id: a new log
    memory.withdraw("gone", left)
    memory.finish("gone", left)
    assert memory.pending("gone", None, 2.0) == Pending(1, 7, frozenset({"rev"}))
    with pytest.raises(ValueError, match="recorded for replica 'gone'; withdrawn or finished"):
        memory.withdraw("a", back)  # a mark pairing it with another replica


def test_withdrawing_or_ending_a_decision_twice_leaves_an_equal_one_alone() -> None:
    """Entries were matched by value: a second withdraw of one decision removed another
    request's equal one (same instant, revision and tokens: a burst), and withdrawing one
    whose equal twin had ended made the ended one load again."""
    memory = DecisionMemory(ttl_s=1.0)
    first = memory.record("a", "rev", 10, at_s=0.0)
    memory.record("a", "rev", 10, at_s=0.0)  # another request of the burst
    memory.withdraw("a", first)
    memory.withdraw("a", first)  # twice: the other stays
    assert memory.pending("a", None, 0.5) == Pending(1, 10, frozenset({"rev"}))
    ended = memory.record("a", "rev", 10, at_s=0.0)
    memory.finish("a", ended)
    memory.finish("a", ended)  # twice: the other is still load
    assert memory.pending("a", None, 0.5) == Pending(1, 10, frozenset({"rev"}))
    memory.withdraw("a", first)  # long withdrawn: the ended one stays ended
    assert memory.pending("a", None, 0.5) == Pending(1, 10, frozenset({"rev"}))
    assert memory.first_s("a") == 0.0


def test_an_ended_decision_is_no_load_but_still_names_its_revision_until_it_lapses() -> None:
    """A request answered before its replica's next report counted as waiting there until
    then: short requests back to back made an all but idle replica look saturated."""
    memory = DecisionMemory(ttl_s=1.0)
    short = memory.record("a", "rev", 10, at_s=0.0)
    twin = memory.record("a", "rev", 10, at_s=0.0)  # an equal one, still running
    memory.record("a", "other", 4, at_s=0.1)
    memory.finish("a", short)
    assert memory.pending("a", None, 0.2) == Pending(2, 14, frozenset({"rev", "other"}))
    memory.finish("a", twin)  # the equal one ended too
    assert memory.pending("a", None, 0.2) == Pending(1, 4, frozenset({"rev", "other"}))
    memory.finish("a", short)  # again: nothing more
    assert memory.pending("a", None, 0.2) == Pending(1, 4, frozenset({"rev", "other"}))
    memory.withdraw("a", short)  # an ended one withdrawn: its tokens are not taken twice
    assert memory.pending("a", None, 0.2) == Pending(1, 4, frozenset({"rev", "other"}))
    assert memory.pending("a", 0.05, 0.2) == Pending(1, 4, frozenset({"other"}))  # a report
    assert memory.pending("a", None, 1.5) == NO_PENDING
    memory.finish("a", short)  # lapsed: a no-op
    assert memory.pending("a", None, 1.5) == NO_PENDING


# one step of ``test_any_mix_of_...``: (op, index of a recorded decision, revision, tokens)
_STEPS = st.lists(
    st.tuples(
        st.sampled_from(["record", "finish", "withdraw", "report", "wait"]),
        st.integers(0, 40),
        st.sampled_from(["r1", "r2", None]),
        st.sampled_from([4, 8]),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_STEPS)
def test_any_mix_of_records_ends_withdrawals_repeats_and_lapses_keeps_a_recounts_totals(
    steps: list[tuple[str, int, str | None, int]],
) -> None:
    """``finish`` and ``withdraw`` act on the one decision ``record`` returned, once: after
    any mix of decisions (coarse times, few revisions: equal ones are common), ends and
    withdrawals of any of them, repeated or after they lapsed, and reports, the totals equal a
    recount of the decisions kept, each tracked by itself."""
    memory = DecisionMemory(ttl_s=1.0)
    made: list[tuple[Entry, float, str | None, int]] = []  # every decision, by its handle
    state: dict[int, str] = {}  # index in ``made`` -> "load", "ended" or "gone"
    now, report_s = 0.0, None
    for op, pick, key, tokens in steps:
        if op == "record" or not made:
            made.append((memory.record("a", key, tokens, at_s=now), now, key, tokens))
            state[len(made) - 1] = "load"
        elif op == "finish":
            i = pick % len(made)
            memory.finish("a", made[i][0])
            if state[i] == "load":
                state[i] = "ended"
        elif op == "withdraw":
            i = pick % len(made)
            memory.withdraw("a", made[i][0])
            state[i] = "gone"
        elif op == "report":
            report_s = now
        else:
            now += 0.25
        cutoff = max(now - 1.0, report_s if report_s is not None else -1.0)
        for i, (_, at_s, _, _) in enumerate(made):
            if at_s < cutoff:
                state[i] = "gone"  # lapsed
        kept = [i for i in state if state[i] != "gone"]
        load = [i for i in kept if state[i] == "load"]
        got = memory.pending("a", report_s, now)
        keys = frozenset(made[i][2] for i in kept) - {None}
        assert got == Pending(len(load), sum(made[i][3] for i in load), keys)
        assert memory.first_s("a") == (made[kept[0]][1] if kept else None)
