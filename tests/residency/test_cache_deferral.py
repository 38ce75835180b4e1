"""A demand load for a low-value adapter waits (boundedly) for a slot its own kind holds instead
of evicting a hot adapter: cost_aware defers, lru (the vLLM baseline) and lru_priority never do.
The wait is bounded per request, counted from when the request asked: a request that already
queued behind other deferred loads is deferred for what is left of its budget only, and the
cache caps whatever a policy asks for at ``max_request_deferral_s``."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from cache_kit import Rig, key, make_rig

from loraplex.artifacts.identity import AdapterKey
from loraplex.residency.cache import CacheConfig
from loraplex.residency.ledger import Tier
from loraplex.residency.policy import Candidate, CostAwarePolicy, EvictionPolicy

HOT, HOT2 = key("prio", "hot"), key("prio", "hot2")
BUSY, NEW, NEW2 = key("batch", "busy"), key("batch", "new"), key("batch", "new2")
BOUND_S = 0.5  # CostAwareConfig.demand_defer_s


def _rig(policy: str | EvictionPolicy, hot: Sequence[AdapterKey] = (HOT,), **config: float) -> Rig:
    rig = make_rig(policy, None, slots=1 + len(hot), default_deadline_s=30.0, **config)
    rig.cache.set_tenant_limits({"prio": 4.0, "batch": 0.25}, {})
    for _ in range(20):  # steadily used adapters, idle right now
        for adapter in hot:
            future = rig.cache.acquire_future(adapter)
            rig.settle(0.5)
            future.result(timeout=0).release()
    return rig


def test_cost_aware_waits_for_the_busy_one_off_instead_of_evicting_the_hot_adapter() -> None:
    rig = _rig("cost_aware")
    busy = rig.cache.acquire_future(BUSY)
    rig.settle(0.5)
    held = busy.result(timeout=0)
    waiting = rig.cache.acquire_future(NEW)
    rig.settle(0.3)  # within the bound
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


def test_a_request_deferred_again_and_again_gets_its_load_once_the_bound_is_reached() -> None:
    rig = _rig("cost_aware")
    busy = rig.cache.acquire_future(BUSY)
    rig.settle(0.5)
    busy.result(timeout=0)  # held for the whole test
    waiting = rig.cache.acquire_future(NEW)
    rig.settle(BOUND_S - 0.02)  # several rechecks, each deferring again
    assert not waiting.done() and rig.cache.is_resident(HOT, Tier.L0)
    rig.settle(0.04)  # the bound: the load displaces what it must
    assert waiting.result(timeout=0).key == NEW
    assert not rig.cache.is_resident(HOT, Tier.L0)
    rig.check()


def test_a_request_that_queued_behind_a_deferred_load_only_waits_out_its_own_budget() -> None:
    # One cold load at a time for the batch tenant: NEW2 queues while NEW is deferred.
    rig = _rig("cost_aware", hot=(HOT, HOT2), tenant_max_concurrent_loads=1)
    busy = rig.cache.acquire_future(BUSY)
    rig.settle(0.5)
    busy.result(timeout=0)
    first = rig.cache.acquire_future(NEW)
    rig.settle(0.3)
    second = rig.cache.acquire_future(NEW2)  # asked 0.3 s into NEW's deferral
    rig.settle(BOUND_S - 0.3 + 0.02)
    first.result(timeout=0)  # NEW reached its bound and took a hot slot; held from here on
    assert not second.done()
    rig.settle(0.3 - 0.04)  # NEW2 started with 0.2 s of its 0.5 s budget spent
    assert not second.done()
    rig.settle(0.04)  # 0.5 s after NEW2 asked, not 0.5 s after its load started
    assert second.result(timeout=0).key == NEW2
    assert not rig.cache.is_resident(HOT, Tier.L0) and not rig.cache.is_resident(HOT2, Tier.L0)
    rig.check()


class _DefersForever(CostAwarePolicy):
    """A policy that would wait without end: the cache's cap must still end the wait."""

    def deferral_s(
        self,
        incoming: Candidate,
        victims: Sequence[Candidate],
        held: Sequence[Candidate],
        waited_s: float,
        now_s: float,
    ) -> float:
        return 100.0


def test_the_cache_caps_any_policy_at_max_request_deferral_s() -> None:
    rig = _rig(_DefersForever(), max_request_deferral_s=0.3)
    busy = rig.cache.acquire_future(BUSY)
    rig.settle(0.5)
    busy.result(timeout=0)
    waiting = rig.cache.acquire_future(NEW)
    rig.settle(0.28)
    assert not waiting.done()
    rig.settle(0.04)
    assert waiting.result(timeout=0).key == NEW
    assert not rig.cache.is_resident(HOT, Tier.L0)
    rig.check()


class _DefersAnUlp(CostAwarePolicy):
    """Asks for the rest of a bound that came out as a few ulps of the clock."""

    def deferral_s(
        self,
        incoming: Candidate,
        victims: Sequence[Candidate],
        held: Sequence[Candidate],
        waited_s: float,
        now_s: float,
    ) -> float:
        return 1e-15


def test_a_deferral_below_a_millisecond_displaces_at_once_instead_of_spinning() -> None:
    """A timer a few ulps ahead fires at the same instant with the same waited time: without
    the cache's minimum the load re-deferred forever at one simulated time."""
    rig = _rig(_DefersAnUlp())
    busy = rig.cache.acquire_future(BUSY)
    rig.settle(0.5)
    busy.result(timeout=0)
    waiting = rig.cache.acquire_future(NEW)
    for _ in range(1000):
        if waiting.done() or not rig.executor.step():
            break
    assert waiting.result(timeout=0).key == NEW
    rig.check()


def test_max_request_deferral_s_is_validated() -> None:
    from cache_kit import budgets

    with pytest.raises(ValueError, match="max_request_deferral_s"):
        CacheConfig(budgets(), max_request_deferral_s=-1.0)
    assert CacheConfig(budgets(), max_request_deferral_s=0.0).max_request_deferral_s == 0.0


@pytest.mark.parametrize("policy", ["lru", "lru_priority"])
def test_lru_policies_never_defer(policy: str) -> None:
    rig = _rig(policy)
    busy = rig.cache.acquire_future(BUSY)
    rig.settle(0.5)
    busy.result(timeout=0)
    waiting = rig.cache.acquire_future(NEW)
    rig.settle(0.1)  # the load's own stages, no deferral
    assert waiting.result(timeout=0).key == NEW
    assert not rig.cache.is_resident(HOT, Tier.L0)
    rig.check()


@pytest.mark.parametrize(("policy", "survivor"), [("lru", BUSY), ("lru_priority", HOT)])
def test_lru_priority_evicts_the_lower_class_first_lru_the_least_recent(
    policy: str, survivor: AdapterKey
) -> None:
    rig = _rig(policy)  # HOT (priority 4) used long ago
    idle = rig.cache.acquire_future(BUSY)  # a batch copy (priority 0.25) used just now
    rig.settle(0.5)
    idle.result(timeout=0).release()
    rig.settle(0.5)
    waiting = rig.cache.acquire_future(NEW)
    rig.settle(0.1)  # the load's own stages, no deferral
    assert waiting.result(timeout=0).key == NEW
    assert rig.cache.is_resident(survivor, Tier.L0)
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
    rig.settle(0.3)  # the one-off ages into a victim; the periodic recheck notices
    assert waiting.result(timeout=0).key == NEW
    assert rig.cache.is_resident(HOT, Tier.L0) and not rig.cache.is_resident(BUSY, Tier.L0)
    rig.check()


def test_a_one_off_still_loading_is_awaited_not_the_hot_adapter() -> None:
    rig = _rig("cost_aware")
    first = rig.cache.acquire_future(BUSY)
    second = rig.cache.acquire_future(NEW)  # both placed before either copy is ready
    rig.settle(0.3)
    lease = first.result(timeout=0)
    assert not second.done() and rig.cache.is_resident(HOT, Tier.L0)
    lease.release()
    rig.settle(0.1)
    assert second.result(timeout=0).key == NEW
    assert rig.cache.is_resident(HOT, Tier.L0)
    rig.check()
