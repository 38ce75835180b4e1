"""A demand load for a low-value adapter waits (boundedly) for a slot its own kind holds instead
of evicting a hot adapter: cost_aware defers, lru (the vLLM baseline) never does."""

from __future__ import annotations

from cache_kit import Rig, key, make_rig

from loraplex.residency.ledger import Tier

HOT = key("prio", "hot")
BUSY, NEW = key("batch", "busy"), key("batch", "new")


def _rig(policy: str) -> Rig:
    rig = make_rig(policy, slots=2, default_deadline_s=30.0)
    rig.cache.set_tenant_limits({"prio": 4.0, "batch": 0.25}, {})
    for _ in range(20):  # a steadily used adapter, idle right now
        future = rig.cache.acquire_future(HOT)
        rig.settle(0.5)
        future.result(timeout=0).release()
    return rig


def test_cost_aware_waits_for_the_busy_one_off_instead_of_evicting_the_hot_adapter() -> None:
    rig = _rig("cost_aware")
    busy = rig.cache.acquire_future(BUSY)
    rig.settle(0.5)
    held = busy.result(timeout=0)
    waiting = rig.cache.acquire_future(NEW)
    rig.settle(0.5)  # within demand_defer_s (1 s)
    assert not waiting.done()
    assert rig.cache.is_resident(HOT, Tier.L0)
    rig.check()
    held.release()  # the one-off's slot frees: the waiting load takes it
    rig.settle(0.1)
    lease = waiting.result(timeout=0)
    assert lease.slot == held.slot
    assert rig.cache.is_resident(HOT, Tier.L0) and not rig.cache.is_resident(BUSY, Tier.L0)
    rig.check()
    stats = rig.cache.snapshot().stats
    assert stats.evictions.get(Tier.L0, 0) == 1


def test_the_deferral_is_bounded_then_the_load_displaces_what_it_must() -> None:
    rig = _rig("cost_aware")
    busy = rig.cache.acquire_future(BUSY)
    rig.settle(0.5)
    busy.result(timeout=0)  # held for the whole test
    waiting = rig.cache.acquire_future(NEW)
    rig.settle(0.9)
    assert not waiting.done()
    rig.settle(0.5)  # past demand_defer_s: the timer retries, the hot adapter goes
    assert waiting.result(timeout=0).key == NEW
    assert not rig.cache.is_resident(HOT, Tier.L0)
    rig.check()


def test_lru_evicts_the_idle_hot_adapter_at_once() -> None:
    rig = _rig("lru")
    busy = rig.cache.acquire_future(BUSY)
    rig.settle(0.5)
    busy.result(timeout=0)
    waiting = rig.cache.acquire_future(NEW)
    rig.settle(0.1)
    assert waiting.result(timeout=0).key == NEW
    assert not rig.cache.is_resident(HOT, Tier.L0)
    rig.check()


def test_a_just_released_one_off_too_young_to_evict_is_awaited_not_the_hot_adapter() -> None:
    rig = _rig("cost_aware")
    busy = rig.cache.acquire_future(BUSY)
    rig.settle(0.05)
    busy.result(timeout=0).release()  # idle, but younger than min_residency_s (0.25 s)
    waiting = rig.cache.acquire_future(NEW)
    rig.settle(0.05)
    assert not waiting.done()  # the young one-off ranks after HOT, yet HOT stays
    assert rig.cache.is_resident(HOT, Tier.L0)
    rig.settle(0.5)  # the one-off ages into a victim; the periodic recheck notices
    assert waiting.result(timeout=0).key == NEW
    assert rig.cache.is_resident(HOT, Tier.L0) and not rig.cache.is_resident(BUSY, Tier.L0)
    rig.check()


def test_a_one_off_still_loading_is_awaited_not_the_hot_adapter() -> None:
    rig = _rig("cost_aware")
    first = rig.cache.acquire_future(BUSY)
    second = rig.cache.acquire_future(NEW)  # both placed before either copy is ready
    rig.settle(0.5)
    lease = first.result(timeout=0)
    assert not second.done() and rig.cache.is_resident(HOT, Tier.L0)
    lease.release()
    rig.settle(0.5)
    assert second.result(timeout=0).key == NEW
    assert rig.cache.is_resident(HOT, Tier.L0)
    rig.check()
