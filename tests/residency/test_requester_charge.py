"""A copy is charged to the tenant whose request loaded it (``acquire_future(requester=...)``),
not to the revision's owner: a tenant calling another tenant's public adapter makes room from
its own share of each tier, so the owner's own copies, within the owner's share, stay
(attack25, part A: the owner's GPU hit share fell from 0.98 to 0.01). A hit by the owner moves
the charge to the owner; a hit by another tenant changes nothing. With no requester (warm
policies, prefetch, pins, the replay) the owner is charged, as before."""

from __future__ import annotations

import pytest
from cache_kit import UNIT, Rig, key, make_rig

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.residency.ledger import Tier, TierBudget, TierLedger
from loraplex.residency.stats import Stage
from loraplex.residency.warm import AutoWarmConfig

OWN = [key("globex", "codegen"), key("globex", "summarize")]  # the owner's two, its 2-slot share
ACME = [key("acme", "support"), key("acme", "billing")]  # the caller's own two
SEARCH = key("globex", "search")  # the owner's public adapter, called by acme


def _use(rig: Rig, adapter: AdapterKey, requester: str | None = None) -> None:
    future = rig.cache.acquire_future(adapter, requester=requester)
    rig.settle()
    future.result(timeout=0).release()
    rig.clock.advance(0.2)
    rig.check()


def _held(rig: Rig, tenant: str, tier: Tier = Tier.L0) -> int:
    return rig.cache.ledgers[tier].tenant_bytes.get(tenant, 0) // UNIT


def _charged(rig: Rig, adapter: AdapterKey, tier: Tier = Tier.L0) -> str:
    entry = rig.cache.ledgers[tier].get(adapter)
    assert entry is not None
    return entry.charged


def _squat(policy: str) -> int:
    """The owner's requests that missed L0 while acme cycled its own two and the public one."""
    rig = make_rig(policy, slots=4, l1=8, l2=16, share=0.5)
    for k in OWN:
        _use(rig, k, "globex")
    for k in ACME:
        _use(rig, k, "acme")
    missed = 0
    for _ in range(20):
        for k in [*ACME, SEARCH]:
            _use(rig, k, "acme")
        for k in OWN:
            missed += not rig.cache.is_resident(k, Tier.L0)
            _use(rig, k, "globex")
        assert _held(rig, "globex") == 2 and _held(rig, "acme") == 2
    return missed


def test_a_public_copy_is_made_room_for_from_the_callers_share() -> None:
    """Owner-charged (attack25), all 40 of the owner's requests missed, under either policy:
    acme's load of ``search`` was globex's, past globex's share, so it evicted globex's own."""
    assert _squat("cost_aware") == 0
    assert _squat("lru") == 0


def test_each_tier_charges_the_requester() -> None:
    rig = make_rig(slots=4, l1=8, l2=16, share=0.5)
    _use(rig, SEARCH, "acme")
    for tier in (Tier.L0, Tier.L1, Tier.L2):
        assert _charged(rig, SEARCH, tier) == "acme"
        assert _held(rig, "acme", tier) == 1 and _held(rig, "globex", tier) == 0


def test_an_owner_hit_moves_the_charge_and_another_callers_hit_does_not() -> None:
    rig = make_rig(slots=4, l1=8, l2=16, share=0.5)
    _use(rig, SEARCH, "acme")
    _use(rig, SEARCH, "initech")  # another non-owner's hit: nothing changes
    assert _charged(rig, SEARCH) == "acme" and _held(rig, "initech") == 0
    _use(rig, SEARCH, "globex")  # the owner would have loaded it anyway
    for tier in (Tier.L0, Tier.L1, Tier.L2):
        assert _charged(rig, SEARCH, tier) == "globex"
        assert _held(rig, "globex", tier) == 1 and _held(rig, "acme", tier) == 0
    _use(rig, SEARCH, "acme")  # a non-owner's hit never takes the charge back
    assert _charged(rig, SEARCH) == "globex" and _held(rig, "acme") == 0


def test_the_owners_ask_takes_over_a_callers_load_under_way() -> None:
    rig = make_rig(slots=4, l1=8, l2=16, share=0.5)
    first = rig.cache.acquire_future(SEARCH, requester="acme")
    second = rig.cache.acquire_future(SEARCH, requester="globex")  # joins the load
    assert not first.done() and not second.done()
    rig.settle()
    first.result(timeout=0).release()
    second.result(timeout=0).release()
    rig.check()
    for tier in (Tier.L0, Tier.L1, Tier.L2):
        assert _charged(rig, SEARCH, tier) == "globex" and _held(rig, "acme", tier) == 0


def test_no_requester_charges_the_owner() -> None:
    rig = make_rig(slots=4, l1=8, l2=16, share=0.5)
    _use(rig, SEARCH)
    assert _charged(rig, SEARCH) == "globex"
    rig.cache.prefetch(key("globex", "other"), Tier.L1)
    rig.settle()
    assert _charged(rig, key("globex", "other"), Tier.L1) == "globex"
    _use(rig, SEARCH, "acme")  # an acme load now: it stays the owner's
    assert _charged(rig, SEARCH) == "globex"
    _use(rig, key("acme", "x"))
    assert _charged(rig, key("acme", "x")) == "acme"


def test_the_callers_cap_bounds_its_loads_of_a_public_adapter() -> None:
    """acme's GPU cap (1 slot) counts its load of ``search``: its own copy makes room."""
    rig = make_rig(slots=4, l1=8, l2=16, tenant_l0={"acme": UNIT})
    _use(rig, ACME[0], "acme")
    _use(rig, SEARCH, "acme")
    assert not rig.cache.is_resident(ACME[0], Tier.L0)
    assert _held(rig, "acme") == 1 and _held(rig, "globex") == 0


def test_a_recharge_moves_the_bytes_and_respects_the_new_tenants_cap() -> None:
    ledger = TierLedger(Tier.L0, TierBudget(4 * UNIT, 4, tenant_max_bytes={"globex": UNIT}))
    ledger.reserve(key("globex", "a"), UNIT, 0.0)
    ledger.reserve(SEARCH, UNIT, 0.0, charged="acme")
    assert ledger.tenant_bytes == {"globex": UNIT, "acme": UNIT}
    assert not ledger.recharge(SEARCH, "globex")  # globex's cap is full: acme keeps it
    assert ledger.tenant_bytes == {"globex": UNIT, "acme": UNIT}
    ledger.remove(key("globex", "a"))
    assert ledger.recharge(SEARCH, "globex")
    assert ledger.tenant_bytes == {"globex": UNIT} and ledger.entries[SEARCH].charged == "globex"
    ledger.check()
    ledger.remove(SEARCH)
    assert ledger.tenant_bytes == {}
    ledger.check()


def test_a_callers_loads_take_its_own_load_permits_not_the_owners() -> None:
    """``tenant_max_concurrent_loads`` counts a load for the tenant it is charged to: acme's
    load of ``search`` takes acme's one permit, so globex's own load starts at once (counted
    under globex, it queued behind acme's) and acme's next load waits for acme's permit."""
    rig = make_rig(slots=4, l1=8, l2=16, tenant_max_concurrent_loads=1)
    asked = [rig.cache.acquire_future(SEARCH, requester="acme")]
    assert rig.cache.is_moving(SEARCH)
    asked.append(rig.cache.acquire_future(OWN[0], requester="globex"))
    assert rig.cache.is_moving(OWN[0])
    asked.append(rig.cache.acquire_future(ACME[0], requester="acme"))
    assert not rig.cache.is_moving(ACME[0])  # acme is at its bound
    rig.check()
    rig.settle()
    for future in asked:
        future.result(timeout=0).release()
    rig.check()


def test_the_owners_ask_moves_a_queued_load_to_its_own_permits() -> None:
    """A caller's load queued behind the caller's own bound starts once the owner asks for it
    too (charged to the owner from then on, under the owner's free permit)."""
    rig = make_rig(slots=4, l1=8, l2=16, tenant_max_concurrent_loads=1)
    docs = key("globex", "docs")
    first = rig.cache.acquire_future(SEARCH, requester="acme")
    second = rig.cache.acquire_future(docs, requester="acme")
    assert not rig.cache.is_moving(docs)  # acme's permit is taken
    third = rig.cache.acquire_future(docs, requester="globex")
    assert rig.cache.is_moving(docs)
    rig.check()
    rig.settle()
    for future in (first, second, third):
        future.result(timeout=0).release()
    assert _charged(rig, docs) == "globex" and _charged(rig, SEARCH) == "acme"
    rig.check()


def test_a_prefetch_for_a_callers_request_is_charged_to_the_caller() -> None:
    """The engine's prefetch window names the queued request's tenant: the host-memory copy
    it brings in is the caller's; a prefetch for the owner's request moves it to the owner; a
    prefetch naming no one (warm policies) charges the owner and moves nothing."""
    rig = make_rig(slots=4, l1=8, l2=16, share=0.5)
    rig.cache.prefetch(SEARCH, Tier.L1, requester="acme")
    rig.settle()
    for tier in (Tier.L1, Tier.L2):
        assert _charged(rig, SEARCH, tier) == "acme" and _held(rig, "globex", tier) == 0
    rig.cache.prefetch(SEARCH, Tier.L1)  # no requester: a ready copy, nothing moves
    assert _charged(rig, SEARCH, Tier.L1) == "acme"
    rig.cache.prefetch(SEARCH, Tier.L1, requester="globex")
    assert _charged(rig, SEARCH, Tier.L1) == "globex" and _held(rig, "acme", Tier.L1) == 0
    rig.cache.prefetch(OWN[0], Tier.L1)
    rig.settle()
    assert _charged(rig, OWN[0], Tier.L1) == "globex"
    rig.check()


def test_eviction_ranks_a_copy_by_the_charged_tenants_priority() -> None:
    """``lru_priority`` evicts the lowest priority first: acme's (1) copy of high-priority
    globex's (4) public adapter goes before initech's (2) older copy, where with the owner's
    priority it outranked initech's copies. Once globex asks, the copy is globex's: it stays."""
    rig = make_rig(
        "lru_priority", slots=2, l1=8, l2=16, tenant_priority={"globex": 4.0, "initech": 2.0}
    )
    first, second, third = (key("initech", n) for n in ("a", "b", "c"))
    _use(rig, first, "initech")
    _use(rig, SEARCH, "acme")
    _use(rig, second, "initech")
    assert rig.cache.is_resident(first, Tier.L0) and not rig.cache.is_resident(SEARCH, Tier.L0)
    _use(rig, SEARCH, "acme")  # back in, evicting initech's older copy (priorities 2 and 2)
    _use(rig, SEARCH, "globex")  # the owner's ask: the copy is globex's, at globex's priority
    _use(rig, third, "initech")
    assert rig.cache.is_resident(SEARCH, Tier.L0) and _charged(rig, SEARCH) == "globex"


def test_an_ask_naming_no_tenant_leaves_a_callers_charge_where_it_is() -> None:
    """attack26: the merged-mode switch asks for the revision it merges with no requester.
    ``auto`` merges the revision carrying most tokens, which a caller of another tenant's
    public adapter chooses, so that ask moved the caller's copies (and a load under way) to
    the owner's charge, where the merge's lease then held one of the owner's L0 shares for as
    long as the caller kept the traffic up. Only the owner's own ask moves a charge now."""
    rig = make_rig(slots=4, l1=8, l2=16, share=0.5)
    _use(rig, SEARCH, "acme")
    held = rig.cache.acquire_future(SEARCH)  # the merge's lease (ModeController._ask)
    rig.settle()
    for tier in (Tier.L0, Tier.L1, Tier.L2):
        assert _charged(rig, SEARCH, tier) == "acme" and _held(rig, "globex", tier) == 0
    held.result(timeout=0).release()
    other = key("globex", "other")
    first = rig.cache.acquire_future(other, requester="acme")  # a caller's load under way
    second = rig.cache.acquire_future(other)  # joined by an ask naming no tenant
    rig.settle()
    first.result(timeout=0).release()
    second.result(timeout=0).release()
    rig.check()
    for tier in (Tier.L0, Tier.L1, Tier.L2):
        assert _charged(rig, other, tier) == "acme"
    _use(rig, SEARCH, "globex")  # the owner's own ask still takes the charge
    assert _charged(rig, SEARCH) == "globex"


@pytest.mark.parametrize("stage", list(Stage))
@pytest.mark.parametrize("joined", [None, "globex", "initech"])
def test_a_charged_load_that_fails_leaves_only_the_tiers_it_filled(
    stage: Stage, joined: str | None
) -> None:
    """attack26: a caller's load of a public adapter failing at any stage (with the owner, or
    another caller, joining it) leaves charged only the copies of the tiers it completed, each
    to the caller (the owner once it joined); nothing in flight stays charged."""
    rig = make_rig(slots=4, l1=8, l2=16, share=0.5)
    rig.pipeline.fail_at[(SEARCH, stage)] = RuntimeError("injected")
    futures = [rig.cache.acquire_future(SEARCH, requester="acme")]
    if joined is not None:
        futures.append(rig.cache.acquire_future(SEARCH, requester=joined))
    rig.settle(5)
    rig.check()
    assert all(isinstance(f.exception(timeout=0), RuntimeError) for f in futures)
    payer = "globex" if joined == "globex" else "acme"
    filled = {Stage.READ: [Tier.L2], Stage.COPY: [Tier.L2, Tier.L1]}.get(stage, [])
    for tier in (Tier.L0, Tier.L1, Tier.L2):
        want = {payer: UNIT} if tier in filled else {}
        assert rig.cache.ledgers[tier].tenant_bytes == want, (tier, stage)


@pytest.mark.parametrize(("requester", "earned"), [("acme", False), ("globex", True), (None, True)])
def test_only_the_owners_requests_earn_its_automatic_warm_seat(
    requester: str | None, earned: bool
) -> None:
    """An automatic warm seat counts in the owner's seat share and GPU cap, so only the owner's
    requests (and asks naming no tenant) earn one: a caller's steady calls of a public adapter
    are served by copies charged to the caller. NOTE: counted from every caller's requests,
    acme's calls won ``globex/search`` a seat of globex's (squatres' residual)."""
    config = AutoWarmConfig(gpu_rps=0.02, cpu_rps=0.002, hysteresis=0.5)
    rig = make_rig(slots=4, l1=8, l2=16, auto_warm=config)
    for _ in range(30):
        _use(rig, SEARCH, requester)
    seat = rig.cache.rebalance().get(SEARCH)
    assert (seat in (WarmPolicy.GPU, WarmPolicy.CPU)) is earned, seat
