"""``tiered_gdsf``: admit_gdsf in L0; in L1 and L2 a copy is worth the requests that read it
(missed every faster tier) per byte. Unit tests of the decision, then in the real cache."""

from __future__ import annotations

import pytest
from cache_kit import key, make_rig, use
from hypothesis import given
from hypothesis import strategies as st

from loraplex.residency.admit_policy import AdmitGdsfPolicy
from loraplex.residency.ledger import Tier
from loraplex.residency.policy import (
    Candidate,
    TieredGdsfFetchPolicy,
    TieredGdsfPolicy,
    make_policy,
    policy_names,
)
from loraplex.residency.warm import RequestRates, RollingRates

NOW = 1000.0
POLICY = TieredGdsfPolicy()


def per_5m(count: float) -> RequestRates:
    """Rates of ``count`` requests just now (a decaying count)."""
    return RequestRates(count / 60.0, count / 300.0, count / 3600.0, count / 86400.0)


def copy(
    name: str,
    *,
    requests: float,
    reads: float | None,
    size: int = 100,
    cost: float = 0.02,
    tier: Tier | None = None,
) -> Candidate:
    rates = per_5m(requests)
    return Candidate(
        key("t", name),
        size,
        0.0,
        990.0,
        rates,
        1.0,
        cost,
        reads=None if reads is None else per_5m(reads),
        tier=tier,
    )


def test_registered_and_selectable_by_name() -> None:
    assert "tiered_gdsf" in policy_names()
    assert isinstance(make_policy("tiered_gdsf"), TieredGdsfPolicy)


def test_in_l0_it_is_admit_gdsf() -> None:
    gpu = copy("a", requests=7, reads=None)
    assert POLICY.keep_score(gpu, NOW) == AdmitGdsfPolicy().keep_score(gpu, NOW)


def test_a_cpu_copy_nobody_reads_goes_before_one_that_is_read() -> None:
    """The adapter served from its GPU slot (many requests, one L1 read) loses its CPU copy
    before one that misses L0 on every request; admit_gdsf, reading request rates, the other
    way round."""
    in_gpu = copy("in_gpu", requests=30, reads=1)
    missing = copy("missing", requests=5, reads=5)
    assert [c.key.name for c in POLICY.order_victims([missing, in_gpu], NOW)] == [
        "in_gpu",
        "missing",
    ]
    assert AdmitGdsfPolicy().order_victims([missing, in_gpu], NOW)[0].key.name == "missing"


def test_byte_tiers_count_misses_per_byte_not_refill_seconds() -> None:
    """Equal reads: the 4x larger copy goes first even though its refill (from the remote
    store) costs ~10x the seconds; admit_gdsf keeps it for those seconds."""
    small = copy("small", requests=6, reads=6, size=100, cost=0.021)
    large = copy("large", requests=6, reads=6, size=400, cost=0.2)
    assert POLICY.order_victims([small, large], NOW)[0].key.name == "large"
    assert AdmitGdsfPolicy().order_victims([small, large], NOW)[0].key.name == "small"


def test_one_offs_stay_on_probation_in_byte_tiers() -> None:
    one_off = copy("oneoff", requests=1, reads=1)
    kept = copy("kept", requests=3, reads=0.1)  # read rarely, but requested: protected
    assert not POLICY.admitted(one_off) and POLICY.admitted(kept)
    assert POLICY.order_victims([kept, one_off], NOW)[0].key.name == "oneoff"


@given(
    counts=st.lists(st.floats(min_value=0.5, max_value=20.0), min_size=2, max_size=5),
    horizon=st.floats(min_value=0.1, max_value=600.0),
    share=st.floats(min_value=0.0, max_value=1.0),
)
def test_floor_bounds_a_byte_tier_key_while_the_copy_idles(
    counts: list[float], horizon: float, share: float
) -> None:
    rates, t = RollingRates(), 0.0
    for count in counts:
        t += 10.0
        rates.record(t, count)
    until = t + horizon

    def at(when: float) -> Candidate:
        now = rates.rates(when)
        return Candidate(key("t", "a"), 100, 0.0, t, now, 1.0, 0.02, reads=now)

    probe = t + share * horizon
    assert POLICY.order_key_floor(at(until), t, until) <= POLICY.order_key(at(probe), probe)


# --- tiered_gdsf_fetch: L2 weighs the remote fetch ---------------------------------------------

FETCH = TieredGdsfFetchPolicy()


def test_the_fetch_variant_is_registered_and_selectable_by_name() -> None:
    assert "tiered_gdsf_fetch" in policy_names()
    assert isinstance(make_policy("tiered_gdsf_fetch"), TieredGdsfFetchPolicy)


def test_in_l2_the_fetch_variant_keeps_the_copy_whose_refetch_costs_more_seconds_per_byte() -> None:
    """Equal reads: the 4x larger L2 copy refetches in ~10x the seconds, so it saves more
    refill seconds per byte and stays; tiered_gdsf (misses per byte) drops it first."""
    small = copy("small", requests=6, reads=6, size=100, cost=0.021, tier=Tier.L2)
    large = copy("large", requests=6, reads=6, size=400, cost=0.2, tier=Tier.L2)
    assert FETCH.order_victims([small, large], NOW)[0].key.name == "small"
    assert POLICY.order_victims([small, large], NOW)[0].key.name == "large"


def test_the_fetch_variant_is_tiered_gdsf_in_l1_and_l0() -> None:
    """L1 refills from the local disk (the fixed stall dominates): misses per byte, as
    tiered_gdsf; L0 and a copy whose tier the caller does not say: tiered_gdsf too."""
    for tier in (Tier.L1, None):
        small = copy("small", requests=6, reads=6, size=100, cost=0.021, tier=tier)
        large = copy("large", requests=6, reads=6, size=400, cost=0.2, tier=tier)
        assert FETCH.order_victims([small, large], NOW)[0].key.name == "large"
        assert FETCH.keep_score(large, NOW) == POLICY.keep_score(large, NOW)
    gpu = copy("a", requests=7, reads=None, tier=Tier.L0)
    assert FETCH.keep_score(gpu, NOW) == POLICY.keep_score(gpu, NOW)


def test_the_fetch_variant_keeps_one_offs_on_probation_in_l2() -> None:
    one_off = copy("oneoff", requests=1, reads=1, size=400, cost=0.2, tier=Tier.L2)
    kept = copy("kept", requests=3, reads=0.1, tier=Tier.L2)
    assert FETCH.order_victims([kept, one_off], NOW)[0].key.name == "oneoff"


@given(
    counts=st.lists(st.floats(min_value=0.5, max_value=20.0), min_size=2, max_size=5),
    horizon=st.floats(min_value=0.1, max_value=600.0),
    share=st.floats(min_value=0.0, max_value=1.0),
    cost=st.floats(min_value=0.02, max_value=1.0),
    dearer=st.floats(min_value=1.0, max_value=3.0),
)
def test_floor_bounds_an_l2_key_of_the_fetch_variant_while_the_copy_idles(
    counts: list[float], horizon: float, share: float, cost: float, dearer: float
) -> None:
    """The floor, taken with rates decayed to the horizon and the lowest reload cost, bounds
    the key at any instant before it, at any reload cost no lower."""
    rates, t = RollingRates(), 0.0
    for count in counts:
        t += 10.0
        rates.record(t, count)
    until = t + horizon

    def at(when: float, reload_cost: float) -> Candidate:
        now = rates.rates(when)
        return Candidate(key("t", "a"), 100, 0.0, t, now, 1.0, reload_cost, now, Tier.L2)

    probe = t + share * horizon
    floor = FETCH.order_key_floor(at(until, cost), t, until)
    assert floor <= FETCH.order_key(at(probe, cost * dearer), probe)


def test_the_cache_tells_the_policy_each_copys_tier() -> None:
    """Every candidate the real cache hands the policy names the tier its copy is in (the
    fetch variant reads it); three tiers full enough that each ranks victims."""
    seen: dict[str, set[Tier | None]] = {}

    class Spy(TieredGdsfFetchPolicy):
        def keep_score(self, c: Candidate, now_s: float) -> float:
            tiers = seen.setdefault(c.key.name, set())
            tiers.add(c.tier)
            return super().keep_score(c, now_s)

    rig = make_rig(Spy(), slots=1, l1=1, l2=1)
    for _ in range(3):
        for name in ("a", "b"):
            use(rig, key("t", name))
    assert set().union(*seen.values()) == {Tier.L0, Tier.L1, Tier.L2}


# --- in the real cache -------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["tiered_gdsf", "admit_gdsf"])
def test_the_cpu_tier_drops_the_copy_of_an_adapter_that_lives_in_a_gpu_slot(policy: str) -> None:
    """h is used six times and stays in its GPU slot (its CPU copy is read once); p and q
    alternate through the other slot, each reading its CPU copy three times. A newcomer needs
    CPU room: tiered_gdsf drops h's unread CPU copy, admit_gdsf (request rates) drops p's."""
    rig = make_rig(policy, slots=2, l1=3, l2=8)
    h, p, q, n = (key("t", name) for name in ("h", "p", "q", "n"))
    use(rig, h, 6)
    for _ in range(3):
        use(rig, p)
        use(rig, q)
    use(rig, n)
    assert rig.cache.is_resident(h, Tier.L0)
    in_l1 = {k.name for k in (h, p, q) if rig.cache.is_resident(k, Tier.L1)}
    assert in_l1 == ({"p", "q"} if policy == "tiered_gdsf" else {"h", "q"})


@pytest.mark.parametrize("policy", ["tiered_gdsf", "lru"])
def test_a_returning_adapter_is_remembered_and_outlasts_one_offs(policy: str) -> None:
    """a is evicted from every tier by two one-offs, then comes back: its request history (a
    ghost entry) admits it to the protected segment at once, so two more one-offs cycle
    through probation around it. LRU (the control) loses it."""
    rig = make_rig(policy, slots=2, l1=2, l2=2)
    a = key("t", "a")
    use(rig, a)
    for name in ("x", "y"):
        use(rig, key("t", name))
    assert not any(rig.cache.is_resident(a, t) for t in (Tier.L0, Tier.L1, Tier.L2))
    use(rig, a)
    for name in ("w", "z"):
        use(rig, key("t", name))
    kept = all(rig.cache.is_resident(a, t) for t in (Tier.L0, Tier.L1, Tier.L2))
    assert kept == (policy == "tiered_gdsf")
