"""The short path of an L1 -> L0 load into a free slot (``LoadFlow._fill_free_slot``): used
where it applies, not where it does not, and indistinguishable from the general path."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from cache_kit import UNIT, NoL0Staging, Rig, key, make_rig
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loraplex.errors import CapacityError, CorruptArtifactError, LoadCancelledError
from loraplex.residency.cache import Lease
from loraplex.residency.cache import load_flow as load_flow_module
from loraplex.residency.ledger import Tier
from loraplex.residency.stats import Stage

A, B, C = key("t", "a"), key("t", "b"), key("t", "c")


def _rig(short_path: bool = True, **config: Any) -> tuple[Rig, list[bool]]:
    """A rig on a pipeline that stages nothing for L0, and the short path's answers so far
    (``short_path`` False: the general path only)."""
    rig = make_rig(pipeline=NoL0Staging(), **config)
    flow = rig.cache._flow
    answers: list[bool] = []
    real = flow._fill_free_slot

    def spy(*args: Any) -> bool:
        answer = real(*args) if short_path else False
        answers.append(answer)
        return answer

    flow._fill_free_slot = spy  # type: ignore[method-assign]
    return rig, answers


def _lease(rig: Rig, future: Future[Lease]) -> Lease:
    rig.settle()
    return future.result(timeout=0)


def _into_l1(rig: Rig, *keys: object) -> None:
    """Each key loaded (L3 -> L0) and released, then evicted from L0: a ready L1 copy."""
    for k in keys:
        _lease(rig, rig.cache.acquire_future(k)).release()  # type: ignore[arg-type]
        rig.clock.advance(1.0)
        assert rig.cache.evict(k, Tier.L0)  # type: ignore[arg-type]
    rig.check()


def _count_decisions(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    seen: list[object] = []
    real = load_flow_module.decide

    def counting(demand: Any, room: Any) -> Any:
        seen.append(demand)
        return real(demand, room)

    monkeypatch.setattr(load_flow_module, "decide", counting)
    return seen


def test_an_l1_copy_into_a_free_slot_takes_the_short_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig, answers = _rig(slots=2)
    _into_l1(rig, A)
    decisions = _count_decisions(monkeypatch)
    answers.clear()
    future = rig.cache.acquire_future(A)
    assert answers == [True] and decisions == []  # no placement decision was needed
    assert not future.done()  # the install still runs on the executor, off the lock
    assert rig.cache.snapshot().num_loading == 1
    lease = _lease(rig, future)
    assert lease.load.source is Tier.L1 and set(lease.load.seconds) == {Stage.COPY}
    assert rig.pipeline.slots == {lease.slot: A}
    entry = rig.cache.ledgers[Tier.L0].get(A)
    assert entry is not None and entry.ready and entry.refcount == 1
    assert rig.cache.ledgers[Tier.L1].entries[A].refcount == 0  # the source is let go
    rig.check()
    lease.release()
    rig.check()
    assert rig.cache.summary().stats.hits[Tier.L1] >= 1


def test_a_prefetch_into_a_free_slot_takes_it_too() -> None:
    rig, answers = _rig(slots=2)
    _into_l1(rig, A)
    answers.clear()
    done = rig.cache.prefetch(A, Tier.L0)
    rig.settle()
    assert answers == [True] and done.result(timeout=0) is None
    assert rig.cache.is_resident(A, Tier.L0)
    rig.check()


def test_no_short_path_without_an_l1_copy_or_a_free_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    rig, answers = _rig(slots=1)
    decisions = _count_decisions(monkeypatch)
    lease = _lease(rig, rig.cache.acquire_future(A))  # from L3: three moves, each decided
    assert answers == [False] and len(decisions) == 3
    lease.release()
    _into_l1(rig, B)  # B's load evicted A from the one slot; B left L0 afterwards
    held = _lease(rig, rig.cache.acquire_future(B))  # B back in the only slot: no free slot
    answers.clear()
    decisions.clear()
    waiting = rig.cache.acquire_future(A)  # A is in L1, but the slot is leased: it waits
    rig.settle()
    assert answers == [False] and len(decisions) == 1 and not waiting.done()
    held.release()  # a victim now: the general path places A over B's slot
    lease = _lease(rig, waiting)
    assert lease.load.source is Tier.L1 and rig.pipeline.slots == {lease.slot: A}
    lease.release()
    rig.check()


def test_no_short_path_for_a_load_that_must_queue() -> None:
    rig, answers = _rig(slots=3, max_concurrent_loads=1)
    _into_l1(rig, A)
    answers.clear()
    first = rig.cache.acquire_future(B)  # from L3: holds the one load permit
    second = rig.cache.acquire_future(A)  # a free slot and an L1 copy, but no permit
    assert answers == [False, False] and not second.done()
    rig.settle(5.0)
    for future in (first, second):
        future.result(timeout=0).release()
    assert second.result(timeout=0).load.source is Tier.L1
    rig.check()


def test_no_short_path_over_a_tenant_cap_that_needs_a_victim() -> None:
    rig, answers = _rig(slots=3, tenant_l0={"t": UNIT})
    _into_l1(rig, A)
    held = _lease(rig, rig.cache.acquire_future(B))  # t's one copy's worth of L0, in use
    answers.clear()
    waiting = rig.cache.acquire_future(A)  # free slots, but t is at its cap
    rig.settle()
    assert answers == [False] and not waiting.done()
    held.release()
    _lease(rig, waiting).release()
    rig.check()


def test_a_cancelled_short_path_load_undoes_its_slot() -> None:
    rig, answers = _rig(slots=2)
    _into_l1(rig, A)
    answers.clear()
    future = rig.cache.acquire_future(A)
    assert answers == [True]
    assert rig.cache.cancel(A)
    with pytest.raises(LoadCancelledError):
        future.result(timeout=0)
    rig.settle()  # the install returns into a cancelled job: its room and bytes go
    assert not rig.cache.is_resident(A, Tier.L0) and A not in rig.cache.ledgers[Tier.L0].entries
    assert A not in rig.pipeline.slots.values()
    assert rig.cache.ledgers[Tier.L1].entries[A].refcount == 0
    assert rig.cache.snapshot().num_loading == 0
    rig.check()
    lease = _lease(rig, rig.cache.acquire_future(A))  # and the next load is a fresh one
    assert lease.load.source is Tier.L1
    lease.release()
    rig.check()


def test_a_failing_copy_on_the_short_path_fails_its_waiter_and_frees_the_slot() -> None:
    rig, answers = _rig(slots=2)
    _into_l1(rig, A)
    rig.pipeline.fail_at[(A, Stage.COPY)] = CorruptArtifactError("injected")
    answers.clear()
    future = rig.cache.acquire_future(A)
    rig.settle()
    assert answers == [True]
    with pytest.raises(CorruptArtifactError):
        future.result(timeout=0)
    assert A not in rig.cache.ledgers[Tier.L0].entries and rig.pipeline.slots == {}
    assert rig.cache.summary().stats.load_failures == 1
    rig.check()


def test_a_deadline_shorter_than_the_copy_fails_the_waiter_and_undoes_the_load() -> None:
    rig, answers = _rig(slots=2)
    _into_l1(rig, A)
    answers.clear()
    future = rig.cache.acquire_future(A, deadline_s=0.0005)  # the fake copy takes 0.001 s
    rig.settle()
    assert answers == [True]
    with pytest.raises(CapacityError):
        future.result(timeout=0)
    assert A not in rig.cache.ledgers[Tier.L0].entries and rig.pipeline.slots == {}
    rig.check()


def test_a_second_acquirer_joins_the_short_path_load() -> None:
    rig, answers = _rig(slots=2)
    _into_l1(rig, A)
    answers.clear()
    first, second = rig.cache.acquire_future(A), rig.cache.acquire_future(A)
    assert answers == [True]  # the second attached to the job in flight (single flight)
    rig.settle()
    leases = [first.result(timeout=0), second.result(timeout=0)]
    assert {lease.slot for lease in leases} == {leases[0].slot}
    assert rig.cache.ledgers[Tier.L0].entries[A].refcount == 2
    for lease in leases:
        lease.release()
    rig.check()


# --- the short path and the general path side by side --------------------------------------

KEYS = [key(t, n) for t in ("p", "q") for n in ("a", "b", "c", "d")]
TIERS = [Tier.L0, Tier.L1, Tier.L2]
STAGES = [Stage.RESOLVE, Stage.FETCH, Stage.VERIFY, Stage.READ, Stage.COPY]
ACQUIRE = st.tuples(st.just("acquire"), st.sampled_from(KEYS), st.sampled_from([None, 0.0005, 2.0]))
OPS = st.one_of(
    ACQUIRE,
    ACQUIRE,  # twice as likely as any other operation
    st.tuples(st.just("evict"), st.sampled_from(KEYS), st.just(Tier.L0)),  # frees slots
    st.tuples(st.just("release"), st.integers(0, 20)),
    st.tuples(st.just("pin"), st.sampled_from(KEYS), st.sampled_from(TIERS)),
    st.tuples(st.just("unpin"), st.sampled_from(KEYS), st.sampled_from(TIERS)),
    st.tuples(st.just("prefetch"), st.sampled_from(KEYS), st.sampled_from(TIERS)),
    st.tuples(st.just("evict"), st.sampled_from(KEYS), st.sampled_from(TIERS)),
    st.tuples(st.just("fail"), st.sampled_from(KEYS), st.sampled_from(STAGES)),
    st.tuples(st.just("cancel"), st.sampled_from(KEYS)),
    st.tuples(st.just("wait"), st.sampled_from([0.0, 0.0005, 0.004, 0.5, 3.0])),
)


# L1 copies of four keys, none in L0, before the random operations: their acquires and
# prefetches into L0 are what the short path serves (random operations alone rarely get there)
PRELUDE = [
    op
    for k in (KEYS[0], KEYS[1], KEYS[4], KEYS[5])
    for op in (("acquire", k, None), ("wait", 3.0), ("release", 0), ("evict", k, Tier.L0))
]


class _Side:
    """One rig driven by the operations, with its futures and leases in issue order."""

    def __init__(self, short_path: bool) -> None:
        self.rig, self.answers = _rig(
            short_path,
            slots=3,
            l1=4,
            l2=6,
            tenant_l0={"q": 2 * UNIT},
            max_concurrent_loads=2,
            tenant_max_concurrent_loads=1,
            default_deadline_s=2.0,
        )
        self.futures: list[Future[Any]] = []
        self.leases: list[Lease] = []

    def apply(self, op: tuple[Any, ...]) -> None:
        name, *args = op
        cache = self.rig.cache
        if name == "acquire":
            self.futures.append(cache.acquire_future(args[0], deadline_s=args[1]))
        elif name == "release":
            live = [lease for lease in self.leases if not lease._released]
            if live:
                live[args[0] % len(live)].release()
        elif name == "pin":
            self.futures.append(cache.pin(args[0], args[1]))
        elif name == "unpin":
            cache.unpin(args[0], args[1])
        elif name == "prefetch":
            self.futures.append(cache.prefetch(args[0], args[1]))
        elif name == "evict":
            cache.evict(args[0], args[1])
        elif name == "fail":
            self.rig.pipeline.fail_at[(args[0], args[1])] = CorruptArtifactError("injected")
        elif name == "cancel":
            cache.cancel(args[0])
        elif name == "wait":
            self.rig.executor.run_until(self.rig.clock.now() + args[0])
        for future in self.futures:
            if future.done() and not future.exception():
                lease = future.result()
                if isinstance(lease, Lease) and lease not in self.leases:
                    self.leases.append(lease)

    def observed(self) -> tuple[object, ...]:
        """Everything a caller or an operator could see."""
        cache, pipeline = self.rig.cache, self.rig.pipeline
        outcomes = []
        for future in self.futures:
            if not future.done():
                outcomes.append("pending")
            elif future.exception() is not None:
                outcomes.append(type(future.exception()).__name__)
            else:
                result = future.result()
                outcomes.append(
                    None
                    if result is None
                    else (result.key, result.slot, result.load.source, result.load.seconds)
                )
        ledgers = {
            tier: sorted(
                (e.key.ref, e.slot, e.ready, e.refcount, e.pinned, e.size_bytes, e.loaded_at_s)
                for e in ledger.entries.values()
            )
            for tier, ledger in cache.ledgers.items()
        }
        summary = cache.summary()
        return (
            outcomes,
            ledgers,
            summary,
            dict(pipeline.slots),
            {t: sorted(k.ref for k in keys) for t, keys in pipeline.installed.items()},
            [(t, k.ref) for t, k in pipeline.drops],
            self.rig.clock.now(),
        )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, max_size=40))
def test_the_short_path_is_the_general_path_minus_its_steps(
    sequence: list[tuple[Any, ...]],
) -> None:
    short, general = _Side(True), _Side(False)
    for op in [*PRELUDE, *sequence]:
        short.apply(op)
        general.apply(op)
        short.rig.check()
        general.rig.check()
        assert short.observed() == general.observed(), op
    for side in (short, general):
        side.rig.pipeline.fail_at.clear()
        side.apply(("wait", 10.0))
    assert short.observed() == general.observed()


def test_the_side_by_side_workload_reaches_the_short_path() -> None:
    """The differential test above compares something: a plain sequence of its operations
    takes the short path on one side (and never on the other)."""
    short, general = _Side(True), _Side(False)
    for op in [*PRELUDE, ("acquire", KEYS[0], None), ("wait", 3.0)]:
        short.apply(op)
        general.apply(op)
    assert short.observed() == general.observed()
    assert True in short.answers and True not in general.answers
