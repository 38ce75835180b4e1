"""TierLedger accounting and its integrity checks; warm-policy promotion/demotion."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cache_kit import key

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.errors import AdapterTooLargeError, CacheIntegrityError, TenantCapTooSmallError
from loraplex.residency.ledger import ResidentEntry, Tier, TierBudget, TierLedger
from loraplex.residency.warm import AutoWarmConfig, PinBook, RequestRates, auto_warm

A, B, C = key("t", "a"), key("t", "b"), key("u", "c")


def ready(ledger: TierLedger, k, size: int) -> None:  # type: ignore[no-untyped-def]
    ledger.reserve(k, size, 0.0).ready = True


def test_plan_room_is_greedy_over_ranked_evictable_entries() -> None:
    ledger = TierLedger(Tier.L1, TierBudget(300))
    for k in (A, B, C):
        ready(ledger, k, 100)
    ledger.entries[A].refcount = 1
    ranked = [ledger.entries[k] for k in (A, B, C)]
    victims = ledger.plan_room("t", 150, lambda: ranked)
    assert victims is not None and [v.key for v in victims] == [B, C]
    ledger.entries[B].pinned = True
    assert ledger.plan_room("t", 150, lambda: ranked) is None


def test_plan_room_never_ranks_when_the_load_fits_now() -> None:
    ledger = TierLedger(Tier.L1, TierBudget(300))
    ready(ledger, A, 100)

    def ranked() -> list[ResidentEntry]:
        raise AssertionError("ranked victims although the load fits")

    assert ledger.plan_room("t", 200, ranked) == []


def test_tenant_budget_makes_room_from_own_entries() -> None:
    ledger = TierLedger(Tier.L1, TierBudget(1000, tenant_max_bytes={"t": 200}))
    ready(ledger, C, 100)
    ready(ledger, A, 100)
    ready(ledger, B, 100)
    victims = ledger.plan_room("t", 100, lambda: [ledger.entries[k] for k in (C, A, B)])
    assert victims is not None and [v.key for v in victims] == [A]


def test_slots_are_reused_and_conserved() -> None:
    ledger = TierLedger(Tier.L0, TierBudget(300, num_slots=3))
    slots = [ledger.reserve(k, 100, 0.0).slot for k in (A, B, C)]
    assert slots == [0, 1, 2]
    ledger.remove(B)
    assert ledger.reserve(key("t", "d"), 100, 0.0).slot == 1
    ledger.check()


def test_check_names_the_broken_invariant() -> None:
    ledger = TierLedger(Tier.L0, TierBudget(300, num_slots=3))
    ready(ledger, A, 100)
    ready(ledger, B, 100)
    ledger.entries[B].slot = ledger.entries[A].slot
    with pytest.raises(CacheIntegrityError, match="no slot owned twice"):
        ledger.check()
    ledger = TierLedger(Tier.L1, TierBudget(300))
    ready(ledger, A, 100)
    ledger.used_bytes = 50
    with pytest.raises(CacheIntegrityError, match="accounting"):
        ledger.check()
    ledger.used_bytes = 100
    ledger.entries[A].refcount = -1
    with pytest.raises(CacheIntegrityError, match="non-negative"):
        ledger.check()


def test_inadmissible_sizes_fail_fast() -> None:
    ledger = TierLedger(Tier.L1, TierBudget(300, tenant_max_bytes={"t": 100}))
    with pytest.raises(AdapterTooLargeError):
        ledger.check_admissible("t", 200)
    ledger.check_admissible("u", 200)


def test_a_refusal_by_the_tenant_cap_names_the_cap_not_the_adapter() -> None:
    """It said the adapter exceeded the tier's capacity, where the tenant's cap refused it."""
    ledger = TierLedger(Tier.L0, TierBudget(300, 3, tenant_max_bytes={"t": 0}))
    with pytest.raises(TenantCapTooSmallError, match=r"tenant cap max_gpu_bytes 0 of tenant 't'"):
        ledger.check_admissible("t", 100)
    with pytest.raises(AdapterTooLargeError) as larger:  # beyond the tier: the adapter's size
        ledger.check_admissible("t", 400)
    assert not isinstance(larger.value, TenantCapTooSmallError)
    l1 = TierLedger(Tier.L1, TierBudget(300, tenant_max_bytes={"t": 10}))
    with pytest.raises(TenantCapTooSmallError, match="max_cpu_bytes 10"):
        l1.check_admissible("t", 100)


def test_budget_validation() -> None:
    with pytest.raises(ValueError, match="capacity_bytes"):
        TierBudget(-1)


def test_auto_warm_promotes_and_demotes_with_hysteresis() -> None:
    cfg = AutoWarmConfig(gpu_rps=1.0, cpu_rps=0.1, hysteresis=0.5)
    assert auto_warm(RequestRates(0, 1.0, 0.2, 0.1), WarmPolicy.ON_DEMAND, cfg) is WarmPolicy.GPU
    assert auto_warm(RequestRates(0, 0.6, 0.2, 0.1), WarmPolicy.GPU, cfg) is WarmPolicy.GPU
    assert auto_warm(RequestRates(0, 0.6, 0.2, 0.1), WarmPolicy.ON_DEMAND, cfg) is WarmPolicy.CPU
    assert auto_warm(RequestRates(0, 0.4, 0.06, 0.0), WarmPolicy.CPU, cfg) is WarmPolicy.CPU
    assert auto_warm(RequestRates(0, 0.0, 0.01, 0.0), WarmPolicy.CPU, cfg) is WarmPolicy.ON_DEMAND


def test_pin_book_operator_wins_and_auto_gpu_is_bounded() -> None:
    book = PinBook(AutoWarmConfig(gpu_rps=1.0, cpu_rps=0.1), max_auto_gpu=1)
    hot = RequestRates(5, 5, 5, 5)
    assert book.rebalance({A: hot, B: hot}) == {A: WarmPolicy.GPU, B: WarmPolicy.CPU}
    book.set_operator(A, WarmPolicy.ON_DEMAND)
    assert book.pinned_tiers(A) == frozenset()
    book.pin(A, Tier.L2)
    assert book.pinned_tiers(A) == {Tier.L2}
    assert book.is_pinned(B, Tier.L1)


def test_pin_book_forgets_unpinned_and_demoted_revisions() -> None:
    book = PinBook(AutoWarmConfig(gpu_rps=1.0, cpu_rps=0.1), max_auto_gpu=4)
    churn = [key("t", f"rev{i}") for i in range(50)]
    for k in churn:
        book.pin(k, Tier.L2)
        book.unpin(k, Tier.L2)
    hot, idle = RequestRates(5, 5, 5, 5), RequestRates(0, 0, 0, 0)
    book.rebalance(dict.fromkeys(churn, hot))
    assert book.num_keys() == len(churn)  # promoted: pinned while warm
    changes = book.rebalance(dict.fromkeys(churn, idle))
    assert set(changes.values()) == {WarmPolicy.ON_DEMAND}
    assert book.num_keys() == 0
    book.set_operator(A, WarmPolicy.ON_DEMAND)  # an operator's setting stays
    assert book.num_keys() == 1


def test_plan_room_reads_ranked_victims_only_as_far_as_it_picks() -> None:
    ledger = TierLedger(Tier.L1, TierBudget(300))
    for k in (A, B, C):
        ready(ledger, k, 100)
    read: list[AdapterKey] = []

    def ranked() -> Iterator[ResidentEntry]:
        for k in (B, A, C):
            read.append(k)
            yield ledger.entries[k]

    victims = ledger.plan_room("t", 100, ranked)
    assert victims is not None and [v.key for v in victims] == [B]
    assert read == [B]
