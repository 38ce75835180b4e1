"""TieredAdapterCache behaviour on a fake pipeline in simulated time (deterministic)."""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future

import pytest
from cache_kit import UNIT, FakePipeline, NoL0Staging, Rig, budgets, key, make_rig

from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.clock import MonotonicClock
from loraplex.errors import (
    AdapterTooLargeError,
    CapacityError,
    DigestMismatchError,
    LoadCancelledError,
)
from loraplex.residency.cache import (
    CacheConfig,
    CopyHolds,
    Lease,
    TieredAdapterCache,
    Unpinned,
)
from loraplex.residency.ledger import Tier
from loraplex.residency.pipeline import CancelToken, Move, Prepared
from loraplex.residency.stats import Stage
from loraplex.residency.warm import AutoWarmConfig, WarmHold

A, B, C, D = (key("t", n) for n in "abcd")


def lease_of(rig: Rig, future: Future[Lease]) -> Lease:
    rig.settle()
    rig.check()
    return future.result(timeout=0)


def test_cold_acquire_walks_every_tier_and_times_each_stage() -> None:
    rig = make_rig()
    lease = lease_of(rig, rig.cache.acquire_future(A))
    assert lease.load.source is Tier.L3
    assert set(lease.load.seconds) >= {Stage.RESOLVE, Stage.FETCH, Stage.READ, Stage.COPY}
    assert lease.load.total_s == sum(lease.load.seconds.values()) + lease.load.room_wait_s
    assert all(rig.cache.is_resident(A, t) for t in (Tier.L0, Tier.L1, Tier.L2))
    assert rig.pipeline.slots == {lease.slot: A}
    again = rig.cache.acquire_future(A)
    assert again.done() and again.result().load.source is Tier.L0
    stats = rig.cache.snapshot().stats
    assert (stats.misses, stats.hits[Tier.L0]) == (1, 1)
    assert stats.loads == {Tier.L0: 1, Tier.L1: 1, Tier.L2: 1}
    assert stats.stages[Stage.FETCH].count == 1


def test_single_flight_many_acquirers_one_load() -> None:
    rig = make_rig()
    futures = [rig.cache.acquire_future(A) for _ in range(10)]
    rig.settle()
    rig.check()
    leases = [f.result(timeout=0) for f in futures]
    assert rig.pipeline.resolves == 1 and rig.pipeline.fetches == 1
    entry = rig.cache.ledgers[Tier.L0].get(A)
    assert entry is not None and entry.refcount == 10
    for lease in leases:
        lease.release()
        lease.release()  # idempotent
    assert entry.refcount == 0
    rig.check()


def test_refcounted_adapters_are_never_evicted_and_acquirer_gets_capacity_error() -> None:
    rig = make_rig(slots=2, default_deadline_s=5.0)
    held = [lease_of(rig, rig.cache.acquire_future(k)) for k in (A, B)]
    waiting = rig.cache.acquire_future(C)
    rig.settle(2.0)
    assert not waiting.done() and rig.cache.snapshot().num_blocked == 1
    rig.settle(4.0)
    with pytest.raises(CapacityError, match="deadline"):
        waiting.result(timeout=0)
    assert rig.cache.is_resident(A, Tier.L0) and rig.cache.is_resident(B, Tier.L0)
    assert not rig.cache.ledgers[Tier.L0].get(C)
    rig.check()
    held[0].release()
    lease = lease_of(rig, rig.cache.acquire_future(C))
    assert lease.slot == held[0].slot  # A's slot, freed by its eviction
    assert not rig.cache.is_resident(A, Tier.L0) and rig.cache.is_resident(A, Tier.L1)


def test_waiter_gets_slot_when_a_lease_is_released_before_deadline() -> None:
    rig = make_rig(slots=1, default_deadline_s=5.0)
    first = lease_of(rig, rig.cache.acquire_future(A))
    waiting = rig.cache.acquire_future(B)
    rig.settle()
    first.release()
    assert lease_of(rig, waiting).key == B


def test_pinned_adapter_is_never_evicted_and_unpin_releases_it() -> None:
    rig = make_rig(slots=2, default_deadline_s=1.0)
    pinned = rig.cache.pin(A, Tier.L0)
    rig.settle()
    assert pinned.result(timeout=0) is None
    assert rig.cache.ledgers[Tier.L0].entries[A].pinned
    for k in (B, C, D):
        lease_of(rig, rig.cache.acquire_future(k)).release()
        assert rig.cache.is_resident(A, Tier.L0)
    assert rig.cache.pinned_keys() == {e.key for e in rig.cache.snapshot().entries if e.pinned}
    assert rig.cache.pinned_keys() == {A}
    assert rig.cache.num_evictions() == sum(rig.cache.summary().stats.evictions.values()) > 0
    assert not rig.cache.evict(A, Tier.L0)
    rig.cache.unpin(A, Tier.L0)
    rig.check()
    assert rig.cache.pinned_keys() == set()
    assert rig.cache.evict(A, Tier.L0)
    rig.check()


@pytest.mark.parametrize(
    "stage", [Stage.RESOLVE, Stage.FETCH, Stage.VERIFY, Stage.READ, Stage.COPY]
)
def test_failed_load_evicts_nothing_and_leaves_nothing(stage: Stage) -> None:
    rig = make_rig(slots=1, l1=1, l2=1)
    lease_of(rig, rig.cache.acquire_future(A)).release()
    before = {t: set(rig.cache.ledgers[t].entries) for t in (Tier.L0, Tier.L1, Tier.L2)}
    error = DigestMismatchError("adapter", "0" * 64, "1" * 64)
    rig.pipeline.fail_at[(B, stage)] = error
    failing = rig.cache.acquire_future(B)
    rig.settle()
    with pytest.raises(DigestMismatchError):
        failing.result(timeout=0)
    rig.check()
    after = {t: set(rig.cache.ledgers[t].entries) for t in (Tier.L0, Tier.L1, Tier.L2)}
    if stage in (Stage.RESOLVE, Stage.FETCH, Stage.VERIFY):
        assert after == before  # nothing displaced by a load that never verified
    assert not rig.pipeline.staged
    assert rig.cache.snapshot().stats.load_failures == 1
    assert rig.cache.snapshot().num_loading == 0


def test_cancel_mid_load_undoes_and_types_the_error() -> None:
    rig = make_rig()
    future = rig.cache.acquire_future(A)
    rig.executor.run_until(0.005)  # resolve done, fetch in flight
    assert rig.cache.cancel(A)
    with pytest.raises(LoadCancelledError):
        future.result(timeout=0)
    rig.settle()
    rig.check()
    assert all(not lg.entries for lg in rig.cache.ledgers.values())
    assert not rig.pipeline.staged


def test_cancelling_the_only_waiter_future_abandons_the_load() -> None:
    rig = make_rig()
    future = rig.cache.acquire_future(A)
    assert future.cancel()
    rig.settle()
    rig.check()
    assert rig.cache.snapshot().num_loading == 0
    assert not rig.cache.is_resident(A, Tier.L0)


def test_concurrency_is_bounded_globally_and_per_tenant() -> None:
    rig = make_rig(slots=8, l1=8, l2=8, max_concurrent_loads=3, tenant_max_concurrent_loads=2)
    keys = [key("x", f"a{i}") for i in range(4)] + [key("y", "b0")]
    futures = [rig.cache.acquire_future(k) for k in keys]
    rig.check()
    # Started loads resolve first: x up to its bound of two, then y's one (three in all).
    assert rig.pipeline.resolved == [keys[0], keys[1], keys[4]]
    assert rig.cache.summary().num_loading == len(keys)
    rig.settle()
    assert all(f.result(timeout=0) for f in futures)


def test_tenant_budget_holds_and_evicts_own_adapters_first() -> None:
    rig = make_rig(slots=4, tenant_l0={"t": 2 * UNIT})
    other = key("u", "z")
    lease_of(rig, rig.cache.acquire_future(other)).release()
    for k in (A, B, C):
        lease_of(rig, rig.cache.acquire_future(k)).release()
        rig.check()
    assert rig.cache.ledgers[Tier.L0].tenant_bytes["t"] == 2 * UNIT
    assert rig.cache.is_resident(other, Tier.L0)


def test_adapter_too_big_for_a_tier_fails_fast() -> None:
    rig = make_rig(l1=2)
    rig.pipeline.sizes[A] = 3
    future = rig.cache.acquire_future(A)
    rig.settle()
    with pytest.raises(AdapterTooLargeError, match="L1"):  # permanent: retrying cannot help
        future.result(timeout=0)
    rig.check()


def test_prefetch_fills_lower_tiers_only_and_counts_hits_there() -> None:
    rig = make_rig()
    rig.cache.prefetch(A, Tier.L1)
    rig.settle()
    assert rig.cache.is_resident(A, Tier.L1) and not rig.cache.is_resident(A, Tier.L0)
    lease = lease_of(rig, rig.cache.acquire_future(A))
    assert lease.load.source is Tier.L1
    assert rig.cache.snapshot().stats.hits[Tier.L1] == 1


def test_reload_after_eviction_and_thrash_ratio() -> None:
    rig = make_rig("lru", slots=1)
    for k in (A, B, A):
        lease_of(rig, rig.cache.acquire_future(k)).release()
    stats = rig.cache.snapshot().stats
    assert stats.evictions[Tier.L0] == 2
    assert stats.reloads_after_eviction[Tier.L0] == 1
    assert stats.thrash_ratio == pytest.approx(0.5)


def test_warm_policies_operator_wins_over_automatic() -> None:
    rig = make_rig(auto_warm=AutoWarmConfig(gpu_rps=0.3, cpu_rps=0.01), max_auto_gpu_slots=1)
    for _ in range(200):
        lease_of(rig, rig.cache.acquire_future(A)).release()
    assert rig.cache.rebalance() == {A: WarmPolicy.GPU}
    assert rig.cache.ledgers[Tier.L0].entries[A].pinned
    rig.cache.set_warm_policy(A, WarmPolicy.ON_DEMAND)
    assert not rig.cache.ledgers[Tier.L0].entries[A].pinned
    assert rig.cache.rebalance() == {}
    rig.cache.set_warm_policy(B, WarmPolicy.CPU)
    rig.settle()
    assert rig.cache.ledgers[Tier.L1].entries[B].pinned
    assert not rig.cache.is_resident(B, Tier.L0)
    rig.check()


def test_drop_auto_warm_unpins_and_starts_the_rates_afresh() -> None:
    """A deprecated revision (``drop_auto_warm``): its automatic gpu seat goes at once and the
    next rebalance does not hand it back from the alias traffic's rates; requests from then on
    can earn one again. An operator's warm policy stays (``B``)."""
    rig = make_rig(auto_warm=AutoWarmConfig(gpu_rps=0.3, cpu_rps=0.01), max_auto_gpu_slots=1)
    for _ in range(200):
        lease_of(rig, rig.cache.acquire_future(A)).release()
    rig.cache.set_warm_policy(B, WarmPolicy.CPU)
    rig.settle()
    assert rig.cache.rebalance() == {A: WarmPolicy.GPU}
    rig.cache.drop_auto_warm(A)
    rig.cache.drop_auto_warm(B)
    assert not rig.cache.ledgers[Tier.L0].entries[A].pinned
    assert rig.cache.holds(A, Tier.L0).warm == frozenset()
    assert rig.cache.rebalance() == {}
    assert rig.cache.evict(A, Tier.L0)
    assert rig.cache.ledgers[Tier.L1].entries[B].pinned
    for _ in range(200):  # its owner's pins alone, as hot as the alias was: earned again
        lease_of(rig, rig.cache.acquire_future(A)).release()
    assert rig.cache.rebalance() == {A: WarmPolicy.GPU}
    rig.check()


def test_an_unpin_says_which_warm_policy_keeps_the_copy_pinned() -> None:
    """An automatic gpu policy (or the operator's) pins the copy past the operator's unpin:
    the answer names it instead of claiming the copy unpinned."""
    rig = make_rig(auto_warm=AutoWarmConfig(gpu_rps=0.3, cpu_rps=0.01), max_auto_gpu_slots=1)
    for _ in range(200):
        lease_of(rig, rig.cache.acquire_future(A)).release()
    assert rig.cache.rebalance() == {A: WarmPolicy.GPU}
    rig.cache.pin(A, Tier.L0)
    automatic = frozenset({WarmHold(WarmPolicy.GPU, automatic=True)})
    assert rig.cache.unpin(A, Tier.L0) == Unpinned(True, automatic)
    assert rig.cache.unpin(A, Tier.L0) == Unpinned(False, automatic)
    assert rig.cache.unpin(A, Tier.L1) == Unpinned(False)  # gpu pins L0 only
    rig.cache.set_warm_policy(A, WarmPolicy.CPU)
    operator = frozenset({WarmHold(WarmPolicy.CPU, automatic=False)})
    assert rig.cache.unpin(A, Tier.L1) == Unpinned(False, operator)
    rig.cache.set_warm_policy(A, WarmPolicy.ON_DEMAND)
    rig.cache.pin(A, Tier.L1)
    assert rig.cache.unpin(A, Tier.L1) == Unpinned(True)
    rig.settle()
    rig.check()


def test_holds_name_what_keeps_a_copy_from_eviction() -> None:
    """A kept ``evict`` is told why (the admin answer said "pinned, in use or loading")."""
    rig = make_rig()
    assert rig.cache.holds(A, Tier.L0) == CopyHolds(resident=False, pinned=False)
    lease = lease_of(rig, rig.cache.acquire_future(A))
    assert rig.cache.holds(A, Tier.L0) == CopyHolds(resident=True, pinned=False, in_use=1)
    rig.cache.pin(A, Tier.L0)
    assert not rig.cache.evict(A, Tier.L0)
    assert rig.cache.holds(A, Tier.L0) == CopyHolds(resident=True, pinned=True, in_use=1)
    lease.release()
    rig.cache.unpin(A, Tier.L0)
    assert rig.cache.holds(A, Tier.L0) == CopyHolds(resident=True, pinned=False)
    assert rig.cache.evict(A, Tier.L0)
    rig.check()


def test_snapshot_reports_per_adapter_counters() -> None:
    rig = make_rig()
    lease = lease_of(rig, rig.cache.acquire_future(A))
    rig.cache.acquire_future(A).result(timeout=0).release()
    snap = rig.cache.snapshot()
    (l0,) = [e for e in snap.entries if e.tier is Tier.L0]
    assert (l0.key, l0.refcount, l0.hits, l0.loads, l0.size_bytes) == (A, 1, 1, 1, UNIT)
    assert snap.tier_of(A) is Tier.L0
    lease.release()


class _SlowPipeline(FakePipeline):
    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate

    def prepare(self, move: Move, cancel: CancelToken) -> Prepared:
        self.gate.wait(timeout=5)
        return super().prepare(move, cancel)


def test_async_acquire_does_not_block_the_event_loop() -> None:
    gate = threading.Event()
    cfg = CacheConfig(budgets=budgets(), default_deadline_s=10.0)
    cache = TieredAdapterCache(cfg, _SlowPipeline(gate), clock=MonotonicClock())

    async def main() -> tuple[int, Lease]:
        task = asyncio.ensure_future(asyncio.wrap_future(cache.acquire_future(A)))
        ticks = 0
        for _ in range(5):  # the loop keeps running while the load is stuck in prepare
            await asyncio.sleep(0.01)
            ticks += 1
        gate.set()
        return ticks, await asyncio.wait_for(task, timeout=5)

    try:
        ticks, lease = asyncio.run(main())
        assert ticks == 5 and lease.key == A
        lease.release()
        cache.check_integrity()
    finally:
        gate.set()
        cache.close()


def test_async_cancel_abandons_load() -> None:
    gate = threading.Event()
    cfg = CacheConfig(budgets=budgets(), default_deadline_s=10.0)
    pipeline = _SlowPipeline(gate)
    cache = TieredAdapterCache(cfg, pipeline, clock=MonotonicClock())

    async def main() -> None:
        future = cache.acquire_future(A)
        task = asyncio.ensure_future(asyncio.wrap_future(future))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(main())
        gate.set()
    finally:
        cache.close()
    cache.check_integrity()
    assert cache.snapshot().num_loading == 0
    assert not any(lg.entries for lg in cache.ledgers.values())
    assert not pipeline.staged


def test_copy_that_fails_verification_on_read_is_dropped_and_refetched() -> None:
    rig = make_rig()
    lease_of(rig, rig.cache.acquire_future(A)).release()
    assert rig.cache.evict(A, Tier.L0) and rig.cache.evict(A, Tier.L1)
    rig.pipeline.fail_at[(A, Stage.READ)] = DigestMismatchError("L2 copy", "0" * 64, "1" * 64)
    failing = rig.cache.acquire_future(A)
    rig.settle()
    with pytest.raises(DigestMismatchError):
        failing.result(timeout=0)
    rig.check()
    assert not rig.cache.is_resident(A, Tier.L2)  # never served from the bad copy again
    del rig.pipeline.fail_at[(A, Stage.READ)]
    lease = lease_of(rig, rig.cache.acquire_future(A))
    assert lease.load.source is Tier.L3 and rig.pipeline.fetches == 2
    lease.release()
    rig.check()


def test_a_failed_load_is_logged_with_its_revision_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a tenant only gets adapter_load_failed: the server log is the operator's trace of which
    # revision and why, and a tenant retrying it must not fill that log
    rig = make_rig()
    rig.pipeline.fail_at[(A, Stage.FETCH)] = DigestMismatchError("adapter", "0" * 64, "1" * 64)

    def fail_once() -> None:
        failing = rig.cache.acquire_future(A)
        rig.settle()
        with pytest.raises(DigestMismatchError):
            failing.result(timeout=0)

    with caplog.at_level(logging.WARNING, logger="loraplex.residency.cache.failure_log"):
        for _ in range(3):
            fail_once()
        assert len(caplog.messages) == 1
        rig.clock.advance(60.0)
        fail_once()
    assert len(caplog.messages) == 2
    assert caplog.messages[0].startswith(f"adapter {A.ref} failed to load (DigestMismatchError): ")
    assert caplog.messages[0].endswith(f"`loraplex adapters verify {A.ref}` re-checks it")
    assert rig.cache.snapshot().stats.load_failures == 4
    rig.check()


def test_transient_failure_keeps_the_good_lower_copy() -> None:
    rig = make_rig()
    lease_of(rig, rig.cache.acquire_future(A)).release()
    assert rig.cache.evict(A, Tier.L0)
    rig.pipeline.fail_at[(A, Stage.COPY)] = CapacityError("device busy")
    failing = rig.cache.acquire_future(A)
    rig.settle()
    with pytest.raises(CapacityError):
        failing.result(timeout=0)
    assert rig.cache.is_resident(A, Tier.L1) and rig.cache.is_resident(A, Tier.L2)
    rig.check()


def test_pin_that_cannot_fit_beside_other_pins_fails_and_frees_the_tenant() -> None:
    rig = make_rig(slots=3, tenant_l0={"t": 2 * UNIT}, tenant_max_concurrent_loads=1)
    pins = [rig.cache.pin(k, Tier.L0) for k in (A, B, C)]
    rig.settle()
    assert pins[0].result(timeout=0) is None and pins[1].result(timeout=0) is None
    with pytest.raises(CapacityError, match="pinned adapters leave no room"):
        pins[2].result(timeout=0)
    rig.check()
    # The tenant's load slot is free again: an acquire of a pinned adapter is served at once.
    lease = lease_of(rig, rig.cache.acquire_future(A))
    lease.release()
    assert rig.cache.snapshot().num_loading == 0


def test_lowered_tenant_cap_evicts_idle_copies_and_keeps_those_in_use() -> None:
    rig = make_rig(slots=4)
    held = [lease_of(rig, rig.cache.acquire_future(k)) for k in (A, B)]
    lease_of(rig, rig.cache.acquire_future(C)).release()
    rig.cache.set_tenant_limits({"t": 0.25}, {Tier.L0: {"t": UNIT}})
    assert not rig.cache.is_resident(C, Tier.L0)  # idle: evicted down towards the cap
    assert all(rig.cache.is_resident(k, Tier.L0) for k in (A, B))  # in use: stay
    rig.check()  # over the new cap only by what was in use when it was lowered
    for lease in held:
        lease.release()
    rig.check()
    lease = lease_of(rig, rig.cache.acquire_future(D))  # admission obeys the cap again
    assert rig.cache.ledgers[Tier.L0].tenant_bytes["t"] == UNIT
    lease.release()
    rig.check()


def test_a_pipeline_that_stages_nothing_for_l0_gets_no_l0_prepare() -> None:
    rig = make_rig(slots=1, pipeline=NoL0Staging())
    lease_of(rig, rig.cache.acquire_future(A)).release()  # L3 -> L0: three moves, two prepared
    assert rig.pipeline.slots == {0: A}
    rig.clock.advance(1.0)
    lease = lease_of(rig, rig.cache.acquire_future(B))  # evicts A from its slot
    assert lease.load.source is Tier.L3 and rig.pipeline.slots == {0: B}
    lease.release()
    rig.clock.advance(1.0)
    future = rig.cache.acquire_future(A)  # from L1: placed at once, installed by the executor
    assert not future.done()
    lease = lease_of(rig, future)
    assert lease.load.source is Tier.L1 and set(lease.load.seconds) == {Stage.COPY}
    assert rig.pipeline.slots == {0: A}
    lease.release()
    rig.pipeline.fail_at[(B, Stage.COPY)] = DigestMismatchError("adapter", "0" * 64, "1" * 64)
    failing = rig.cache.acquire_future(B)  # an L1 -> L0 install that fails undoes its move
    rig.settle()
    with pytest.raises(DigestMismatchError):
        failing.result(timeout=0)
    rig.check()
    assert not rig.cache.is_resident(B, Tier.L0) and rig.cache.snapshot().num_loading == 0


def test_queued_l0_prefetches_that_fail_at_once_leave_the_queue_consistent() -> None:
    """Prefetches into a full L0 of copies already in L1 fail at their placement, inside the
    pump that started them, which then pumps again: the outer pump skips the jobs the nested
    ones started or retired."""
    rig = make_rig(slots=1, l1=8, l2=8, max_concurrent_loads=1, pipeline=NoL0Staging())
    for k in (A, B, C, D):  # each in L1 (one slot: each evicts the one before from L0)
        lease_of(rig, rig.cache.acquire_future(k)).release()
        rig.clock.advance(1.0)
    held = lease_of(rig, rig.cache.acquire_future(D))  # D stays in the slot, leased
    E = key("t", "e")
    waiting = rig.cache.acquire_future(E)  # takes the one load permit, then waits for room
    rig.settle()
    prefetches = [rig.cache.prefetch(k, Tier.L0) for k in (A, B, C)]  # queued behind E
    assert not any(f.done() for f in prefetches)
    held.release()  # E takes the slot; then A, B and C find it leased to E's acquirer
    e_lease = lease_of(rig, waiting)
    for future in prefetches:
        with pytest.raises(CapacityError):
            future.result(timeout=0)
    rig.check()
    assert rig.cache.snapshot().num_loading == 0
    e_lease.release()
