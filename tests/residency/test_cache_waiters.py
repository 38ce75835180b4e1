"""Waiter races: deadline timers end with their waiter, and a cancelled waiter of a finished load
cannot abort a later load of the same key."""

from __future__ import annotations

import gc
import weakref

from cache_kit import Rig, key, make_rig
from hypothesis import given, settings
from hypothesis import strategies as st

from loraplex.residency.ledger import Tier

A = key("t", "a")


def live_timers(rig: Rig) -> int:
    return sum(1 for *_, timer in rig.executor._events if not timer.cancelled)


def test_deadline_timer_is_cancelled_when_the_waiter_settles() -> None:
    rig = make_rig(default_deadline_s=30.0)
    future = rig.cache.acquire_future(A)
    rig.settle(1.0)
    future.result(timeout=0).release()
    assert live_timers(rig) == 0  # a thread-backed executor would keep no sleeping timer
    rig.check()


def test_a_cancelled_deadline_event_lets_its_waiter_go_before_it_comes_due() -> None:
    """The event stays queued until its time (30 s here) but holds nothing: the settled
    waiter's future can be freed at once, not 30 simulated seconds later."""
    rig = make_rig(default_deadline_s=30.0)
    future = rig.cache.acquire_future(A)
    rig.settle(1.0)
    future.result(timeout=0).release()
    gone = weakref.ref(future)
    del future
    gc.collect()  # the future and its done-callbacks' closures form a cycle
    assert len(rig.executor._events) == 1 and live_timers(rig) == 0
    assert gone() is None
    rig.settle(40.0)
    assert not rig.executor._events
    rig.check()


def test_cancelled_waiter_of_an_old_load_leaves_a_new_load_alone() -> None:
    rig = make_rig()
    old = rig.cache.acquire_future(A)
    rig.settle()
    old.result(timeout=0).release()
    assert rig.cache.evict(A, Tier.L0)
    new = rig.cache.acquire_future(A)
    assert not old.cancel()  # already done: nothing to abandon
    rig.settle()
    assert new.result(timeout=0).load.source is Tier.L1
    rig.check()


@settings(max_examples=60, deadline=None)
@given(
    deadlines=st.lists(st.sampled_from([0.001, 0.02, 0.05, 1.0, None]), min_size=1, max_size=6),
    cancels=st.lists(st.booleans(), min_size=6, max_size=6),
    step_s=st.sampled_from([0.001, 0.01, 0.03]),
)
def test_deadlines_and_cancels_racing_one_load(
    deadlines: list[float | None], cancels: list[bool], step_s: float
) -> None:
    """Waiters of one cold load with mixed deadlines, some cancelled mid-load: every future ends
    settled, every granted lease is the only refcount, nothing leaks, no timer outlives them."""
    rig = make_rig(slots=1)
    futures = [rig.cache.acquire_future(A, deadline_s=d) for d in deadlines]
    for future, cancel in zip(futures, cancels, strict=False):
        rig.settle(step_s)
        if cancel:
            future.cancel()
        rig.check()
    rig.settle(2.0)
    rig.check()
    leases = [f.result(timeout=0) for f in futures if not f.cancelled() and f.exception() is None]
    entry = rig.cache.ledgers[Tier.L0].get(A)
    assert (entry.refcount if entry else 0) == len(leases)
    for lease in leases:
        lease.release()
    assert all(f.done() for f in futures)
    assert live_timers(rig) == 0
    assert rig.cache.snapshot().num_loading == 0
    rig.check()
