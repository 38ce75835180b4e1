"""The default per-tenant share of each tier (``TierBudget.default_tenant_share``): a tenant
without a byte cap of its own cannot take more than its share of a tier, whatever it sweeps
through; an explicit cap wins; one adapter larger than the share is still served, alone."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from cache_kit import UNIT, Rig, key, make_rig

from loraplex.residency.cache import Lease
from loraplex.residency.ledger import CACHED_TIERS, Tier, TierBudget, TierLedger

SWEEP = [key("t", f"s{i}") for i in range(8)]  # one tenant's long tail
OTHER = [key("u", "x"), key("u", "y")]  # another tenant's hot adapters


def _serve(rig: Rig, future: Future[Lease]) -> None:
    rig.settle()
    rig.check()
    future.result(timeout=0).release()


def _sweep(rig: Rig) -> dict[Tier, int]:
    """``OTHER`` loaded first, then ``t`` sweeps ``SWEEP``; t's largest holding per tier."""
    for k in OTHER:
        _serve(rig, rig.cache.acquire_future(k))
    most = dict.fromkeys(CACHED_TIERS, 0)
    for k in SWEEP:
        _serve(rig, rig.cache.acquire_future(k))
        for tier, ledger in rig.cache.ledgers.items():
            most[tier] = max(most[tier], ledger.tenant_bytes.get("t", 0))
    return most


def test_a_sweep_takes_no_more_than_its_share_and_the_other_tenant_stays() -> None:
    rig = make_rig(slots=4, l1=6, l2=8, share=0.5)
    most = _sweep(rig)
    assert most == {Tier.L0: 2 * UNIT, Tier.L1: 3 * UNIT, Tier.L2: 4 * UNIT}
    for k in OTHER:  # idle, least recently used: without the share they would have gone
        assert all(rig.cache.is_resident(k, tier) for tier in (Tier.L0, Tier.L1, Tier.L2))


def test_without_a_share_the_sweep_flushes_the_other_tenant() -> None:
    """The control: share 1.0 (the cache's default) lets one tenant take every slot."""
    rig = make_rig(slots=4, l1=6, l2=8)
    most = _sweep(rig)
    assert most[Tier.L0] == 4 * UNIT
    assert not any(rig.cache.is_resident(k, Tier.L0) for k in OTHER)


def test_an_explicit_cap_wins_over_the_share() -> None:
    rig = make_rig(slots=4, l1=6, l2=8, share=0.5, tenant_l0={"t": 3 * UNIT})
    assert _sweep(rig)[Tier.L0] == 3 * UNIT
    assert rig.cache.ledgers[Tier.L0].tenant_cap("u") == 2 * UNIT  # others keep the share


def test_one_adapter_larger_than_the_share_is_held_alone() -> None:
    rig = make_rig(slots=4, l1=4, l2=8, share=0.5)
    big, small = key("t", "big"), key("t", "small")
    rig.pipeline.sizes[big] = 3  # 3 units of L1 against a share of 2: the tier holds it
    _serve(rig, rig.cache.acquire_future(big))
    assert rig.cache.is_resident(big, Tier.L1)
    _serve(rig, rig.cache.acquire_future(small))  # beside it, t would hold 4 > 2: big goes
    assert not rig.cache.is_resident(big, Tier.L1)
    assert rig.cache.ledgers[Tier.L1].tenant_bytes["t"] == UNIT


def test_dropping_an_explicit_cap_falls_back_to_the_share() -> None:
    rig = make_rig(slots=4, l1=6, l2=8, share=0.5, tenant_l0={"t": 4 * UNIT})
    for k in SWEEP[:4]:
        _serve(rig, rig.cache.acquire_future(k))
    assert rig.cache.ledgers[Tier.L0].tenant_bytes["t"] == 4 * UNIT
    rig.cache.set_tenant_limits({}, {})  # the operator cleared t's max_gpu_bytes
    assert rig.cache.ledgers[Tier.L0].tenant_bytes["t"] == 2 * UNIT  # idle copies evicted
    rig.check()


def test_copies_in_use_stay_over_the_share_until_released() -> None:
    rig = make_rig(slots=4, l1=6, l2=8, share=0.5, tenant_l0={"t": 4 * UNIT})
    futures = [rig.cache.acquire_future(k) for k in SWEEP[:3]]
    rig.settle()
    held = [f.result(timeout=0) for f in futures]
    rig.cache.set_tenant_limits({}, {})
    assert rig.cache.ledgers[Tier.L0].tenant_bytes["t"] == 3 * UNIT  # all in use: kept
    rig.check()
    for lease in held:
        lease.release()
    rig.check()
    _serve(rig, rig.cache.acquire_future(SWEEP[3]))  # admission obeys the share again
    assert rig.cache.ledgers[Tier.L0].tenant_bytes["t"] == 2 * UNIT


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5, float("nan")])
def test_a_share_outside_0_1_is_refused_naming_it(share: float) -> None:
    with pytest.raises(ValueError, match="default_tenant_share"):
        TierBudget(1000, default_tenant_share=share)


def test_the_default_cap_is_the_share_of_the_capacity() -> None:
    ledger = TierLedger(Tier.L1, TierBudget(1000, default_tenant_share=0.25))
    assert ledger.budget.default_tenant_max_bytes == 250
    assert ledger.tenant_cap("anyone") == 250
    assert ledger.tenant_cap("anyone", size_bytes=400) == 400  # one larger copy, alone
    assert TierBudget(1000).default_tenant_max_bytes is None
