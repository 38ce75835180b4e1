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


def test_random_records_ends_withdrawals_and_reports_keep_the_totals_of_a_recount() -> None:
    """``finish`` asks a count kept beside the entries (it scanned them all): after any mix of
    decisions, ends, withdrawals and lapses the totals equal a recount of what is kept."""
    import random
    from collections import Counter

    rng = random.Random(0)
    memory = DecisionMemory(ttl_s=5.0)
    entries: list[tuple[float, str | None, int]] = []  # the reference: kept, in time order
    ended: Counter[tuple[float, str | None, int]] = Counter()
    report_s: float | None = None
    for step in range(3000):
        now = step * 0.01
        op = rng.random()
        if op < 0.4 or not entries:
            # coarse times and few keys: equal entries are common
            entry = (round(now, 1), rng.choice(["r1", "r2", None]), rng.choice([4, 8]))
            assert memory.record("a", entry[1], entry[2], at_s=entry[0]) == entry
            entries.append(entry)
        elif op < 0.75:
            entry = rng.choice(entries)
            memory.finish("a", entry)
            if entries.count(entry) > ended[entry]:
                ended[entry] += 1
        elif op < 0.9:
            entry = rng.choice(entries)
            memory.withdraw("a", entry)
            entries.remove(entry)
            if ended[entry]:
                ended[entry] -= 1
        else:
            report_s = now - rng.random()
        cutoff = max(now - 5.0, report_s if report_s is not None else -1.0)
        while entries and entries[0][0] < cutoff:
            gone = entries.pop(0)
            if ended[gone]:
                ended[gone] -= 1
        got = memory.pending("a", report_s, now)
        num_done = sum(ended.values())
        tokens = sum(e[2] for e in entries) - sum(e[2] * n for e, n in ended.items())
        keys = frozenset(e[1] for e in entries if e[1] is not None)
        assert got == Pending(len(entries) - num_done, tokens, keys), step
