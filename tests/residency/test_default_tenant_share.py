"""The default per-tenant share of each tier (``TierBudget.default_tenant_share``) is
work-conserving: a tenant may borrow free room beyond its share (one busy tenant fills every
slot), and when a load needs room the borrowed copies go first, so every tenant gets its share
back as soon as it asks and no tenant's long tail flushes another's adapters. An explicit byte
cap stays hard; one adapter larger than the share is still served."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from cache_kit import UNIT, Rig, key, make_rig

from loraplex.artifacts.identity import AdapterKey
from loraplex.residency.cache import Lease
from loraplex.residency.cache.config import share_outranks
from loraplex.residency.ledger import CACHED_TIERS, Tier, TierBudget, TierLedger

SWEEP = [key("t", f"s{i}") for i in range(8)]  # one tenant's long tail
OTHER = [key("u", f"x{i}") for i in range(4)]  # another tenant's adapters


def _serve(rig: Rig, future: Future[Lease]) -> None:
    rig.settle()
    rig.check()
    future.result(timeout=0).release()


def _load(rig: Rig, keys: list[AdapterKey]) -> None:
    for k in keys:
        _serve(rig, rig.cache.acquire_future(k))


def _held(rig: Rig, tenant: str, tier: Tier = Tier.L0) -> int:
    return rig.cache.ledgers[tier].tenant_bytes.get(tenant, 0) // UNIT


def _sweep(rig: Rig) -> dict[Tier, int]:
    """``OTHER[:2]`` loaded first, then ``t`` sweeps ``SWEEP``; t's largest holding per tier."""
    _load(rig, OTHER[:2])
    most = dict.fromkeys(CACHED_TIERS, 0)
    for k in SWEEP:
        _serve(rig, rig.cache.acquire_future(k))
        for tier in CACHED_TIERS:
            most[tier] = max(most[tier], _held(rig, "t", tier))
    return most


def test_a_single_tenant_fills_every_slot_and_then_evicts_its_own() -> None:
    rig = make_rig(slots=8, l1=8, l2=16, share=0.5)
    _load(rig, SWEEP)  # 8 adapters into 8 slots: no miss evicts while a slot is free
    assert all(rig.cache.is_resident(k, Tier.L0) for k in SWEEP)
    assert rig.cache.summary().stats.evictions.get(Tier.L0, 0) == 0
    _load(rig, [key("t", "ninth")])  # a full tier: one of its own copies goes
    assert _held(rig, "t") == 8 and rig.cache.is_resident(key("t", "ninth"), Tier.L0)


def test_a_sweep_borrows_free_room_and_never_takes_the_other_tenants() -> None:
    rig = make_rig(slots=4, l1=6, l2=8, share=0.5)
    # u holds 2 of every tier; t borrows all that is free (L1 share 3, L2 share 4) but, at its
    # share or over it, evicts only its own copies once the tier is full
    assert _sweep(rig) == {Tier.L0: 2, Tier.L1: 4, Tier.L2: 6}
    for k in OTHER[:2]:  # idle, least recently used: without the share they would have gone
        assert all(rig.cache.is_resident(k, tier) for tier in CACHED_TIERS)


def test_without_a_share_the_sweep_flushes_the_other_tenant() -> None:
    """The control: share 1.0 (the cache's default) lets one tenant evict every other copy."""
    rig = make_rig(slots=4, l1=6, l2=8)
    most = _sweep(rig)
    assert most[Tier.L0] == 4
    assert not any(rig.cache.is_resident(k, Tier.L0) for k in OTHER[:2])


def test_a_second_tenant_reclaims_its_share_and_no_more() -> None:
    rig = make_rig(slots=4, l1=8, l2=16, share=0.5)
    _load(rig, SWEEP[:4])
    assert _held(rig, "t") == 4  # alone: every slot
    for n, k in enumerate(OTHER, start=1):
        _load(rig, [k])
        # u under its share takes t's borrowed copies; at its share, it evicts its own
        assert (_held(rig, "u"), _held(rig, "t")) == (min(n, 2), 4 - min(n, 2))
        assert rig.cache.is_resident(k, Tier.L0)
    _load(rig, [SWEEP[4]])  # t at its share evicts its own copy, not u's
    assert (_held(rig, "u"), _held(rig, "t")) == (2, 2)
    assert rig.cache.is_resident(SWEEP[4], Tier.L0)


def test_a_tenant_over_its_share_evicts_its_own_copy_not_an_older_one() -> None:
    rig = make_rig(slots=4, l1=8, l2=16, share=0.5, policy="lru")
    _load(rig, [OTHER[0], *SWEEP[:3]])  # u 1 slot (least recently used), t 3: over its share
    _load(rig, [SWEEP[3]])
    assert rig.cache.is_resident(OTHER[0], Tier.L0)  # plain LRU would have evicted it
    assert not rig.cache.is_resident(SWEEP[0], Tier.L0)  # t's least recently used went
    assert (_held(rig, "t"), _held(rig, "u")) == (3, 1)


def test_the_most_over_share_tenant_gives_room_before_an_older_copy_under_share() -> None:
    rig = make_rig(slots=4, l1=8, l2=16, share=0.5, policy="lru")
    oldest = key("v", "old")
    _load(rig, [oldest, *SWEEP[:3]])  # v 1 slot (least recently used), t 3 (over its share 2)
    _load(rig, [OTHER[0]])
    assert rig.cache.is_resident(oldest, Tier.L0)  # plain LRU would have evicted it
    assert not rig.cache.is_resident(SWEEP[0], Tier.L0)  # t's least recently used went
    assert (_held(rig, "t"), _held(rig, "u"), _held(rig, "v")) == (2, 1, 1)


def test_copies_in_use_are_not_reclaimed_until_released() -> None:
    rig = make_rig(slots=4, l1=8, l2=16, share=0.5)
    futures = [rig.cache.acquire_future(k) for k in SWEEP[:4]]
    rig.settle()
    held = [f.result(timeout=0) for f in futures]
    waiting = rig.cache.acquire_future(OTHER[0])
    rig.settle()
    assert not waiting.done()  # t's copies are all in use: u waits for one
    rig.check()
    held[0].release()
    _serve(rig, waiting)
    assert (_held(rig, "t"), _held(rig, "u")) == (3, 1)
    for lease in held[1:]:
        lease.release()


def test_an_explicit_cap_stays_hard_even_with_free_room() -> None:
    rig = make_rig(slots=4, l1=6, l2=8, share=0.5, tenant_l0={"t": 3 * UNIT})
    _load(rig, SWEEP)
    assert _held(rig, "t") == 3  # one slot stays free: the cap is not a share
    ledger = rig.cache.ledgers[Tier.L0]
    assert ledger.tenant_cap("t") == 3 * UNIT and ledger.tenant_cap("u") is None
    assert ledger.tenant_share("t") == ledger.tenant_share("u") == 2 * UNIT


def test_one_adapter_larger_than_the_share_still_takes_room_from_others() -> None:
    rig = make_rig(slots=4, l1=4, l2=8, share=0.5)
    _load(rig, OTHER)  # u fills L1 (4 units against a share of 2)
    big = key("t", "big")
    rig.pipeline.sizes[big] = 3  # 3 units of L1 against a share of 2: the tier can hold it
    _load(rig, [big])
    assert rig.cache.is_resident(big, Tier.L1)
    assert (_held(rig, "t", Tier.L1), _held(rig, "u", Tier.L1)) == (3, 1)
    _load(rig, [key("t", "small")])  # t over its share evicts its own copy: big goes
    assert not rig.cache.is_resident(big, Tier.L1)
    assert (_held(rig, "t", Tier.L1), _held(rig, "u", Tier.L1)) == (1, 1)


def test_dropping_an_explicit_cap_keeps_the_copies_until_another_tenant_asks() -> None:
    rig = make_rig(slots=4, l1=8, l2=16, share=0.5, tenant_l0={"t": 4 * UNIT})
    _load(rig, SWEEP[:4])
    rig.cache.set_tenant_limits({}, {})  # the operator cleared t's max_gpu_bytes
    assert _held(rig, "t") == 4  # the share is no cap: nothing evicted
    rig.check()
    _load(rig, OTHER[:3])
    assert (_held(rig, "t"), _held(rig, "u")) == (2, 2)


def test_lowering_an_explicit_cap_evicts_idle_copies_down_to_it() -> None:
    rig = make_rig(slots=4, l1=8, l2=16, share=0.5)
    _load(rig, SWEEP[:4])
    rig.cache.set_tenant_limits({}, {Tier.L0: {"t": UNIT}})
    assert _held(rig, "t") == 1
    rig.check()


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5, float("nan")])
def test_a_share_outside_0_1_is_refused_naming_it(share: float) -> None:
    with pytest.raises(ValueError, match="default_tenant_share"):
        TierBudget(1000, default_tenant_share=share)


def test_the_share_is_a_fraction_of_the_capacity_and_no_more_than_a_cap() -> None:
    ledger = TierLedger(
        Tier.L1, TierBudget(1000, tenant_max_bytes={"c": 100}, default_tenant_share=0.25)
    )
    assert ledger.budget.default_tenant_share_bytes == 250
    assert ledger.tenant_share("anyone") == 250 and ledger.tenant_cap("anyone") is None
    assert ledger.claim_limit("anyone", 100) == 250
    assert ledger.claim_limit("anyone", 400) == 400  # one larger copy may take room alone
    assert ledger.tenant_share("c") == ledger.claim_limit("c", 50) == 100
    assert TierBudget(1000).default_tenant_share_bytes is None
    assert TierLedger(Tier.L1, TierBudget(1000)).claim_limit("anyone", 10) is None


def test_borrowed_copies_kept_in_use_do_not_keep_another_tenant_out_for_good() -> None:
    """attack12: t borrows every slot (share 2 of 4) and starts its next request on each copy
    before the last one ends, so no copy of it is ever evictable; u, under its share, waited for
    room until its deadline (a live demo server with --max-loras 4: globex's request a 503
    queue_timeout after 30 s while acme kept two staggered streams on each of 5 revisions)."""
    rig = make_rig(slots=4, l1=8, l2=16, share=0.5)
    first = {k: rig.cache.acquire_future(k) for k in SWEEP[:4]}
    rig.settle()
    leases = {k: f.result(timeout=0) for k, f in first.items()}
    wanted = rig.cache.acquire_future(OTHER[0], deadline_s=60.0)
    for _ in range(10):  # 10 s of t's overlapping requests
        rig.settle()
        for k, old in list(leases.items()):
            # the engine asks for a lease unless the copy is being reclaimed (lease_desk)
            following = None if rig.cache.reclaiming(k) else rig.cache.acquire_future(k)
            old.release()  # after the next request got its lease
            if following is not None:
                leases[k] = following.result(timeout=0)  # a hit: granted at once
            else:
                del leases[k]  # t's request waits for its turn
        rig.check()
    rig.settle()
    assert wanted.done() and wanted.exception() is None, "u never got a slot"
    assert _held(rig, "u") == 1
    assert not any(rig.cache.reclaiming(k) for k in SWEEP[:4])  # nobody waits now


def test_a_pinned_copy_is_never_held_back_for_a_reclaim() -> None:
    """A pin is never evicted, so holding back its leases would only starve its tenant."""
    rig = make_rig(slots=4, l1=8, l2=16, share=0.5)
    for k in SWEEP[:3]:
        pinned = rig.cache.pin(k, Tier.L0)
        rig.settle()
        assert pinned.done() and pinned.exception() is None
    held = rig.cache.acquire_future(SWEEP[3])
    rig.settle()
    lease = held.result(timeout=0)
    wanted = rig.cache.acquire_future(OTHER[0], deadline_s=60.0)
    rig.settle()
    assert not wanted.done()  # t's one unpinned copy is in use
    assert not any(rig.cache.reclaiming(k) for k in SWEEP[:3])  # pinned: leased as ever
    assert rig.cache.reclaiming(SWEEP[3])  # borrowed and unpinned: drained
    lease.release()
    rig.settle()
    assert wanted.done() and wanted.exception() is None


PRIORITY = {"t": 4.0, "u": 0.25}  # t high, u batch (the scheduler's class weights)


def _ranked_rig(by_priority: bool, policy: str = "lru_priority") -> Rig:
    """4 slots at a share of 0.5; t of a higher priority than u."""
    return make_rig(
        policy,
        slots=4,
        l1=8,
        l2=16,
        share=0.5,
        tenant_priority=PRIORITY,
        tier_share_by_priority=by_priority,
    )


@pytest.mark.parametrize("by_priority", [False, True])
def test_a_lower_priority_load_reclaims_no_borrowed_room_under_share_by_priority(
    by_priority: bool,
) -> None:
    """hot-burst at 9 slots: the batch tenant's sweep took its share of the slots back from the
    high-priority tenant's hot set whatever the eviction policy. Under
    ``tier_share_by_priority`` the lower-priority load takes room in the policy's order
    (lru_priority: its own copy first)."""
    rig = _ranked_rig(by_priority)
    _load(rig, SWEEP[:3])  # t borrows one slot beyond its share of 2
    _load(rig, OTHER[:1])
    _load(rig, OTHER[1:2])  # u, under its share, needs a slot
    assert (_held(rig, "t"), _held(rig, "u")) == ((3, 1) if by_priority else (2, 2))
    rig.check()


@pytest.mark.parametrize("by_priority", [False, True])
def test_a_lower_priority_load_holds_up_no_higher_priority_lease(by_priority: bool) -> None:
    rig = _ranked_rig(by_priority, "cost_aware")
    leases = [rig.cache.acquire_future(k) for k in (*SWEEP[:3], OTHER[0])]
    rig.settle()
    assert all(f.done() and f.exception() is None for f in leases)  # every slot in use
    wanted = rig.cache.acquire_future(OTHER[1], deadline_s=60.0)
    rig.settle()
    assert not wanted.done()
    assert rig.cache.reclaiming(SWEEP[0]) is not by_priority
    # the other way round the share holds as ever: t's loads reclaim u's borrowed room
    assert share_outranks(rig.cache.config, "t", "u") is by_priority
    assert not share_outranks(rig.cache.config, "u", "t")


@pytest.mark.parametrize("by_priority", [False, True])
def test_a_higher_priority_load_past_its_share_takes_a_lower_ones_copy(by_priority: bool) -> None:
    """The 8 hot adapters on 12 slots at a share of 0.5: past its 6 slots the hot tenant could
    only evict its own copies while the batch tenant's idle ones stayed."""
    rig = _ranked_rig(by_priority)
    _load(rig, OTHER[:1])
    _load(rig, SWEEP[:3])  # t past its share of 2, every slot taken
    _load(rig, SWEEP[3:4])
    assert (_held(rig, "t"), _held(rig, "u")) == ((4, 0) if by_priority else (3, 1))
    rig.check()
