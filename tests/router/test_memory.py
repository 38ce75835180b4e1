"""``DecisionMemory.withdraw``: a request routed again is pending on its last replica only."""

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
