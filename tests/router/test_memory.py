"""``DecisionMemory.withdraw``: a request routed again is pending on its last replica only;
``finish``: a request that ended is no longer load, its revision still named."""

from __future__ import annotations

from loraplex.router.memory import NO_PENDING, DecisionMemory, Pending


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
    memory.withdraw("gone", late)  # a replica that left
    assert memory.pending("b", None, 2.0) == NO_PENDING


def test_an_ended_decision_is_no_load_but_still_names_its_revision_until_it_lapses() -> None:
    """A request answered before its replica's next report counted as waiting there until
    then: short requests back to back made an all but idle replica look saturated."""
    memory = DecisionMemory(ttl_s=1.0)
    short = memory.record("a", "rev", 10, at_s=0.0)
    memory.record("a", "rev", 10, at_s=0.0)  # an equal one, still running
    memory.record("a", "other", 4, at_s=0.1)
    memory.finish("a", short)
    assert memory.pending("a", None, 0.2) == Pending(2, 14, frozenset({"rev", "other"}))
    memory.finish("a", short)  # the equal one ended too
    assert memory.pending("a", None, 0.2) == Pending(1, 4, frozenset({"rev", "other"}))
    memory.finish("a", short)  # no third: nothing more
    assert memory.pending("a", None, 0.2) == Pending(1, 4, frozenset({"rev", "other"}))
    memory.withdraw("a", short)  # an ended one withdrawn: its tokens are not taken twice
    assert memory.pending("a", None, 0.2) == Pending(1, 4, frozenset({"rev", "other"}))
    assert memory.pending("a", 0.05, 0.2) == Pending(1, 4, frozenset({"other"}))  # a report
    assert memory.pending("a", None, 1.5) == NO_PENDING
    memory.finish("a", short)  # lapsed: a no-op
    memory.finish("gone", short)
    assert memory.pending("a", None, 1.5) == NO_PENDING
