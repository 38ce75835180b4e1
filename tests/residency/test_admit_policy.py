"""admit_gdsf: probation before protected, GDSF keep within protected, ghost memory through the
request history, optional-load admission, bounded deferral, and floors/groups the victim index
may rely on; then the policy in the real cache (every tier) with check_integrity()."""

from __future__ import annotations

import pytest
from cache_kit import key, make_rig, use
from hypothesis import given
from hypothesis import strategies as st

from loraplex.residency.admit_policy import AdmitGdsfConfig, AdmitGdsfPolicy
from loraplex.residency.ledger import Tier
from loraplex.residency.policy import Candidate, make_policy, policy_names
from loraplex.residency.warm import RequestRates, RollingRates

NOW = 1000.0
POLICY = AdmitGdsfPolicy()


def cand(
    name: str,
    *,
    requests: float = 0.0,
    last: float = 990.0,
    priority: float = 1.0,
    cost: float = 0.01,
    size: int = 100,
    tenant: str = "t",
) -> Candidate:
    """A copy whose adapter had ``requests`` requests just now (a decaying count)."""
    rates = RequestRates(requests / 60.0, requests / 300.0, requests / 3600.0, requests / 86400.0)
    return Candidate(key(tenant, name), size, 0.0, last, rates, priority, cost)


def names(ordered: list[Candidate]) -> list[str]:
    return [c.key.name for c in ordered]


def test_registered_and_selectable_by_name() -> None:
    assert "admit_gdsf" in policy_names()
    assert isinstance(make_policy("admit_gdsf"), AdmitGdsfPolicy)


def test_a_just_used_one_off_goes_before_a_less_recent_frequent_copy() -> None:
    hot = cand("hot", requests=20, last=900.0)
    one_off = cand("oneoff", requests=1, last=999.9)
    assert names(POLICY.order_victims([hot, one_off], NOW)) == ["oneoff", "hot"]
    assert POLICY.admitted(hot)
    assert not POLICY.admitted(one_off)


def test_probation_goes_lower_priority_first_then_least_recent() -> None:
    ordered = POLICY.order_victims(
        [
            cand("prio_old", requests=1, last=10.0, priority=4.0),
            cand("batch_new", requests=1, last=999.0, priority=0.25),
            cand("batch_old", requests=1, last=5.0, priority=0.25),
        ],
        NOW,
    )
    assert names(ordered) == ["batch_old", "batch_new", "prio_old"]


def test_a_returning_adapter_is_remembered_and_admitted_at_once() -> None:
    """The request history outlives residency (a ghost entry): a second request within the
    window admits the adapter past probation the moment it is loaded again."""
    rates = RollingRates()
    rates.record(100.0)
    first = Candidate(key("t", "a"), 100, 100.0, 100.0, rates.rates(100.0), 1.0, 0.01)
    rates.record(160.0)  # evicted in between; back a minute later
    again = Candidate(key("t", "a"), 100, 160.0, 160.0, rates.rates(160.0), 1.0, 0.01)
    assert not POLICY.admitted(first)
    assert POLICY.admitted(again)


@pytest.mark.parametrize(
    ("cheap", "dear"),
    [
        ({"priority": 0.5}, {"priority": 2.0}),
        ({"cost": 0.001}, {"cost": 0.1}),  # e.g. refilled from L1 vs from the remote store
        ({"size": 1000}, {"size": 100}),
        ({"requests": 3}, {"requests": 30}),
    ],
)
def test_protected_keep_ingredients(cheap: dict, dear: dict) -> None:  # type: ignore[type-arg]
    low, high = cand("low", **{"requests": 10, **cheap}), cand("high", **{"requests": 10, **dear})
    assert POLICY.keep_score(low, NOW) < POLICY.keep_score(high, NOW)
    assert names(POLICY.order_victims([high, low], NOW)) == ["low", "high"]


def test_an_optional_load_never_displaces_a_protected_copy_from_probation() -> None:
    protected = cand("p", requests=5)
    assert not POLICY.admits(cand("new", requests=1), [protected], NOW)
    assert POLICY.admits(cand("new", requests=1.4), [cand("o", requests=0.2)], NOW)
    assert POLICY.admits(cand("new", requests=50), [protected], NOW)
    assert not POLICY.admits(cand("new", requests=5.5), [protected], NOW)  # within hysteresis
    assert POLICY.admits(cand("new", requests=1), [], NOW)


def test_a_lower_priority_load_defers_for_a_cheaper_held_copy_only_within_its_bound() -> None:
    policy = AdmitGdsfPolicy(AdmitGdsfConfig(demand_defer_s=0.5))
    hot = cand("hot", requests=20, priority=4.0, tenant="prio")
    sweep = cand("sweep", requests=1, priority=0.25, tenant="batch")
    held = [cand("held", requests=1, priority=0.25, tenant="batch")]
    assert policy.deferral_s(sweep, [hot], held, 0.1, NOW) == pytest.approx(0.4)
    assert policy.deferral_s(sweep, [hot], held, 0.5, NOW) == 0.0  # its bound is spent
    assert policy.deferral_s(sweep, [hot], [], 0.0, NOW) == 0.0  # nothing will free up
    same_class = cand("peer", requests=20, tenant="batch", priority=0.25)
    assert policy.deferral_s(sweep, [same_class], held, 0.0, NOW) == 0.0
    assert POLICY.config.demand_defer_s == 0.1  # the default: the batch tenant's P50 bound


rates_st = st.floats(min_value=0.0, max_value=50.0, allow_nan=False)


@given(
    incoming=rates_st,
    victims=st.lists(st.tuples(rates_st, st.sampled_from([0.25, 1.0, 4.0])), max_size=4),
    held=st.lists(rates_st, max_size=4),
    waited=st.floats(min_value=0.0, max_value=5.0, allow_nan=False),
    priority=st.sampled_from([0.25, 1.0, 4.0]),
)
def test_deferral_is_bounded_per_request(
    incoming: float,
    victims: list[tuple[float, float]],
    held: list[float],
    waited: float,
    priority: float,
) -> None:
    policy = AdmitGdsfPolicy(AdmitGdsfConfig(demand_defer_s=0.5))
    wait = policy.deferral_s(
        cand("in", requests=incoming, priority=priority),
        [cand(f"v{i}", requests=r, priority=p) for i, (r, p) in enumerate(victims)],
        [cand(f"h{i}", requests=r) for i, r in enumerate(held)],
        waited,
        NOW,
    )
    assert 0.0 <= wait <= max(0.0, 0.5 - waited)
    if all(p <= priority for _, p in victims):
        assert wait == 0.0


@given(
    counts=st.lists(st.floats(min_value=0.0, max_value=5.0), min_size=1, max_size=6),
    gap=st.floats(min_value=0.0, max_value=30.0),
    horizon=st.floats(min_value=0.0, max_value=600.0),
    probes=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=5),
    tau=st.sampled_from([None, 30.0]),
)
def test_floor_bounds_the_key_while_the_copy_idles(
    counts: list[float], gap: float, horizon: float, probes: list[float], tau: float | None
) -> None:
    """The floor (rates decayed to the horizon) is below the true key at every earlier time."""
    policy = AdmitGdsfPolicy(AdmitGdsfConfig(recency_tau_s=tau))
    rates, t = RollingRates(), 0.0
    for count in counts:
        t += gap
        rates.record(t, count)
    until = t + horizon

    def at(when: float) -> Candidate:
        return Candidate(key("t", "a"), 100, 0.0, t, rates.rates(when), 1.0, 0.02)

    floor = policy.order_key_floor(at(until), t, until)
    for share in probes:
        assert floor <= policy.order_key(at(t + share * horizon), t + share * horizon)


@given(
    lasts=st.lists(st.floats(min_value=0.0, max_value=900.0), min_size=2, max_size=6, unique=True),
    later=st.floats(min_value=0.0, max_value=10_000.0),
)
def test_probation_group_ranks_order_the_keys_for_good(lasts: list[float], later: float) -> None:
    members = [cand(f"m{i}", requests=1, last=last) for i, last in enumerate(lasts)]
    groups = {POLICY.order_group(m, NOW) for m in members}
    assert len({g.group for g in groups if g is not None}) == 1
    by_rank = sorted(members, key=lambda m: POLICY.order_group(m, NOW).rank)  # type: ignore[union-attr]
    assert by_rank == POLICY.order_victims(members, NOW + later)
    assert POLICY.order_group(cand("p", requests=9), NOW) is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("admit_count", -1.0),
        ("short_weight", 1.5),
        ("recency_tau_s", 0.0),
        ("hysteresis", -0.1),
        ("demand_defer_s", -1.0),
    ],
)
def test_config_refuses_bad_values_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        AdmitGdsfConfig(**{field: value})


# --- in the real cache -------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["admit_gdsf", "tiered_gdsf", "tiered_gdsf_fetch", "lru"])
def test_a_sweep_of_one_offs_keeps_the_hot_set_in_every_tier(policy: str) -> None:
    """Three hot adapters used often; then a sweep of eight one-offs of a batch tenant through
    a 4-slot L0, a 5-copy L1 and a 6-copy L2. admit_gdsf and tiered_gdsf keep every hot copy in
    every tier (the one-offs cycle through probation); LRU loses them (the control: the test
    can fail)."""
    rig = make_rig(policy, slots=4, l1=5, l2=6, tenant_priority={"prio": 4.0, "batch": 0.25})
    hot = [key("prio", f"hot{i}") for i in range(3)]
    for _ in range(3):
        for adapter in hot:
            use(rig, adapter)
    for i in range(8):
        use(rig, key("batch", f"cold{i}"))
        rig.check()
    kept = {t: all(rig.cache.is_resident(h, t) for h in hot) for t in (Tier.L0, Tier.L1, Tier.L2)}
    if policy != "lru":
        assert kept == {Tier.L0: True, Tier.L1: True, Tier.L2: True}
    else:
        assert kept == {Tier.L0: False, Tier.L1: False, Tier.L2: False}
    rig.check()
