"""``TierLedger.plan_room`` under a work-conserving share (``residency/reclaim.py``), checked
over random holdings: the pick makes room, a tenant over its share takes only its own copies,
and another tenant's copy goes only while that tenant is over its share or no tenant over its
share has an evictable copy left."""

from __future__ import annotations

from cache_kit import UNIT, key
from hypothesis import given, settings
from hypothesis import strategies as st

from loraplex.residency.ledger import ResidentEntry, Tier, TierBudget, TierLedger

TENANTS = ("a", "b", "c")
SLOTS = 8

copies = st.lists(
    st.tuples(st.sampled_from(TENANTS), st.booleans(), st.integers(0, 10**6)),
    min_size=0,
    max_size=SLOTS,
)


def _ledger(held: list[tuple[str, bool, int]]) -> tuple[TierLedger, list[ResidentEntry]]:
    ledger = TierLedger(Tier.L0, TierBudget(SLOTS * UNIT, SLOTS, default_tenant_share=0.5))
    for i, (tenant, in_use, _) in enumerate(held):
        entry = ledger.reserve(key(tenant, f"c{i}"), UNIT, 0.0)
        entry.ready, entry.refcount = True, int(in_use)
    ranked = sorted(ledger.entries.values(), key=lambda e: held[int(e.key.name[1:])][2])
    return ledger, ranked


@settings(max_examples=300, deadline=None)
@given(copies, st.sampled_from(TENANTS))
def test_the_pick_obeys_the_share(held: list[tuple[str, bool, int]], tenant: str) -> None:
    ledger, ranked = _ledger(held)
    victims = ledger.plan_room(tenant, UNIT, lambda: ranked)
    share = SLOTS * UNIT // 2
    bytes_of = dict(ledger.tenant_bytes)
    if victims is None:  # nothing it may take: every copy it may take is in use
        own = bytes_of.get(tenant, 0) + UNIT > share
        assert all(not e.evictable for e in ranked if not own or e.key.tenant == tenant)
        return
    assert len(victims) == (1 if len(held) == SLOTS else 0)  # free room first
    for i, victim in enumerate(victims):
        owner = victim.key.tenant
        if bytes_of.get(tenant, 0) + UNIT > share:
            assert owner == tenant  # at or over its share: its own copies only
        elif bytes_of[owner] <= share:
            taken = {v.key for v in victims[: i + 1]}
            over = [e for e in ranked if e.evictable and e.key not in taken]
            assert all(bytes_of[e.key.tenant] <= share for e in over if e.key.tenant != tenant)
        bytes_of[owner] -= UNIT
