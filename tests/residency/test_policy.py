"""Eviction policies: ordering, keep-score ingredients, minimum residency, hysteresis, registry."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from cache_kit import key
from hypothesis import given
from hypothesis import strategies as st

from loraplex.residency.policy import (
    Candidate,
    CostAwareConfig,
    CostAwarePolicy,
    LruPolicy,
    make_policy,
    policy_names,
    register_policy,
)
from loraplex.residency.warm import RequestRates, RollingRates

NOW = 1000.0


def cand(
    name: str,
    *,
    last: float = 990.0,
    loaded: float = 0.0,
    rate: float = 0.0,
    priority: float = 1.0,
    cost: float = 0.01,
    size: int = 100,
) -> Candidate:
    return Candidate(
        key("t", name), size, loaded, last, RequestRates(rate, rate, rate, rate), priority, cost
    )


def names(ordered: list[Candidate]) -> list[str]:
    return [c.key.name for c in ordered]


def test_lru_orders_by_last_access() -> None:
    ordered = LruPolicy().order_victims(
        [cand("a", last=5), cand("b", last=1), cand("c", last=3)], NOW
    )
    assert names(ordered) == ["b", "c", "a"]


def test_cost_aware_keeps_frequent_over_just_used_one_offs() -> None:
    hot = cand("hot", last=990.0, rate=2.0)
    one_off = cand("oneoff", last=999.9, rate=0.02)
    assert names(CostAwarePolicy().order_victims([hot, one_off], NOW)) == ["oneoff", "hot"]
    assert names(LruPolicy().order_victims([hot, one_off], NOW)) == ["hot", "oneoff"]


@pytest.mark.parametrize(
    ("cheap", "dear"),
    [
        ({"priority": 0.5}, {"priority": 2.0}),
        ({"cost": 0.001}, {"cost": 0.1}),
        ({"size": 1000}, {"size": 100}),
        ({"last": 100.0}, {"last": 999.0}),
    ],
)
def test_cost_aware_score_ingredients(cheap: dict, dear: dict) -> None:  # type: ignore[type-arg]
    policy = CostAwarePolicy()
    assert policy.keep_score(cand("x", **cheap), NOW) < policy.keep_score(cand("y", **dear), NOW)


def test_minimum_residency_protects_young_entries() -> None:
    policy = CostAwarePolicy(CostAwareConfig(min_residency_s=5.0))
    young = cand("young", loaded=NOW - 1, rate=0.0)
    old = cand("old", loaded=NOW - 100, rate=5.0)
    assert names(policy.order_victims([young, old], NOW)) == ["old", "young"]


def test_hysteresis_refuses_marginal_optional_displacements() -> None:
    policy = CostAwarePolicy(CostAwareConfig(hysteresis=0.5))
    victim = cand("v", rate=1.0)
    assert not policy.admits(cand("slightly", rate=1.2), [victim], NOW)
    assert policy.admits(cand("clearly", rate=3.0), [victim], NOW)
    assert policy.admits(cand("any", rate=0.0), [], NOW)
    assert LruPolicy().admits(cand("any"), [victim], NOW)


def test_registry_by_name() -> None:
    assert {"lru", "cost_aware"} <= set(policy_names())
    assert make_policy("lru").name == "lru"
    with pytest.raises(ValueError, match="unknown"):
        make_policy("fifo")
    with pytest.raises(ValueError, match="already registered"):
        register_policy("lru", LruPolicy)


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="hysteresis"):
        CostAwareConfig(hysteresis=-1)


def test_rolling_rates_decay_per_window() -> None:
    rates = RollingRates()
    for i in range(600):
        rates.record(i * 0.5)  # 2 requests per second for 5 minutes
    now = rates.rates(300.0)
    assert now.per_1m == pytest.approx(2.0, rel=0.02)
    assert now.per_5m == pytest.approx(2.0 * (1 - 2.718281828**-1), rel=0.05)
    later = rates.rates(900.0)
    assert later.per_1m < 0.001 < later.per_1h


@given(
    st.lists(
        st.tuples(st.floats(-5.0, 400.0), st.sampled_from([1.0, 0.5, 3.0])), min_size=1, max_size=40
    )
)
def test_rolling_rates_record_is_decay_then_add_to_the_last_bit(
    events: list[tuple[float, float]],
) -> None:
    """``record`` decays and adds in one pass; the counts must equal decaying every window to
    the new time first and adding after (the two-pass form), bit for bit, including a time
    that goes back (no decay; the clock of the counts stays) and repeated times (no ``exp``)."""
    from loraplex.residency.warm import WINDOWS_S

    rolling = RollingRates()
    counts, at_s = [0.0] * len(WINDOWS_S), None
    t = 0.0
    for step, count in events:
        t += step  # a negative step: time going back
        rolling.record(t, count)
        if at_s is not None:
            dt = max(0.0, t - at_s)
            counts = [c * math.exp(-dt / tau) for c, tau in zip(counts, WINDOWS_S, strict=True)]
        counts = [c + count for c in counts]
        at_s = t if at_s is None else max(at_s, t)
        expected = [
            c * math.exp(-0.0 / tau) / tau for c, tau in zip(counts, WINDOWS_S, strict=True)
        ]
        got = rolling.rates(at_s)
        assert [got.per_1m, got.per_5m, got.per_1h, got.per_24h] == expected


def test_demand_deferral_protects_valuable_victims_for_a_bounded_time() -> None:
    policy = CostAwarePolicy(CostAwareConfig(demand_defer_s=1.0))
    hot = cand("hot", rate=5.0, priority=4.0)
    one_off, busy_one_off = cand("new", rate=0.02, priority=0.25), cand("busy", rate=0.02)
    assert policy.deferral_s(one_off, [hot], [busy_one_off], 0.25, NOW) == pytest.approx(0.75)
    assert policy.deferral_s(one_off, [hot], [busy_one_off], 1.0, NOW) == 0.0  # waited enough
    assert policy.deferral_s(one_off, [hot], [], 0.0, NOW) == 0.0  # nothing will free up
    dear = cand("dear", rate=30.0, priority=4.0)
    assert policy.deferral_s(one_off, [hot], [dear], 0.0, NOW) == 0.0  # no cheaper copy to await
    same_class = cand("rising", rate=0.5, priority=4.0)
    assert policy.deferral_s(same_class, [hot], [busy_one_off], 0.0, NOW) == 0.0
    assert LruPolicy().deferral_s(one_off, [hot], [busy_one_off], 0.0, NOW) == 0.0


@pytest.mark.parametrize("name", ["cost_aware", "lru"])
@given(
    hits=st.lists(st.floats(0.0, 500.0), max_size=8),
    loaded=st.floats(0.0, 1000.0),
    priority=st.sampled_from([0.0, 0.25, 1.0, 4.0]),
    cost=st.floats(0.0, 5.0),
    size=st.integers(1, 10**9),
    wait_s=st.floats(0.0, 30.0),
    at=st.floats(0.0, 1.0),
)
def test_order_key_floor_bounds_the_key_of_an_idle_copy_until_the_horizon(
    name: str,
    hits: list[float],
    loaded: float,
    priority: float,
    cost: float,
    size: int,
    wait_s: float,
    at: float,
) -> None:
    rolling = RollingRates()
    for t in sorted(hits):
        rolling.record(t)
    last = max(hits, default=0.0)
    now, until = 500.0, 500.0 + wait_s
    t = now + at * wait_s

    def at_time(when: float) -> Candidate:
        rates = rolling.rates(when)
        return Candidate(key("t", "x"), size, loaded, last, rates, priority, cost)

    policy = make_policy(name)
    floor = policy.order_key_floor(at_time(until), now, until)
    assert floor <= policy.order_key(at_time(t), t)
    assert floor <= policy.order_key(replace(at_time(t), reload_cost_s=cost * 2), t)


@given(
    lasts=st.lists(
        st.sampled_from([0.0, 990.0, 999.5, 1000.0, 1000.0 + 1e-9, 1e6]), min_size=2, max_size=10
    ),
    young=st.booleans(),
    priority=st.sampled_from([0.0, 0.25, 1.0, 4.0]),
    cost=st.floats(0.0, 5.0),
    shared_cost=st.floats(0.0, 5.0),
    size=st.integers(1, 10**9),
    later=st.sampled_from([0.0, 1e-9, 0.1, 0.3, 60.0, 1e5, 1.0]),
)
def test_a_cost_aware_group_ranks_its_members_as_their_keys_while_it_holds(
    lasts: list[float],
    young: bool,
    priority: float,
    cost: float,
    shared_cost: float,
    size: int,
    later: float,
) -> None:
    """Zero-rate copies of one priority, reload cost, size and youth keep their relative order
    while time passes (a young group until its youth ends) and when all are priced at another
    (shared) reload cost."""
    policy = CostAwarePolicy(CostAwareConfig(min_residency_s=0.25))
    # young: loaded 0.10-0.19 s ago, all under min_residency_s (hence at most 10 members)
    loaded = [NOW - (0.1 + i * 0.01 if young else 100.0) for i in range(len(lasts))]
    members = [
        cand(f"m{i}", last=last, loaded=at, priority=priority, cost=cost, size=size)
        for i, (last, at) in enumerate(zip(lasts, loaded, strict=True))
    ]
    grouped = [policy.order_group(c, NOW) for c in members]
    groups = [g for g in grouped if g is not None]
    assert len(groups) == len(members) and len({g.group for g in groups}) == 1
    ranked = [c for _, c in sorted(zip([g.rank for g in groups], members, strict=True))]
    t = NOW + later
    if t >= min(g.until_s for g in groups):
        assert young  # an old copy's group holds for good
        return
    repriced = [replace(c, reload_cost_s=shared_cost) for c in members]
    for batch in (members, repriced):
        by_key = policy.order_victims(batch, t)
        assert [c.key for c in by_key] == [c.key for c in ranked]


def test_only_zero_rate_copies_form_cost_aware_groups_and_youth_splits_them() -> None:
    policy = CostAwarePolicy(CostAwareConfig(min_residency_s=5.0))
    old = policy.order_group(cand("idle", loaded=NOW - 10), NOW)
    assert old is not None and old.until_s == math.inf
    assert policy.order_group(cand("requested", loaded=NOW - 10, rate=1e-300), NOW) is None
    young = policy.order_group(cand("young", loaded=NOW - 1), NOW)
    assert young is not None and young.group != old.group
    assert NOW + 4 - 1e-3 < young.until_s < NOW + 4  # just before its youth ends
    ending = policy.order_group(cand("ending", loaded=NOW - 5 + 1e-12), NOW)
    assert ending is None  # young by a hair: bounded alone
    cheap, dear = cand("a", loaded=0.0), cand("b", loaded=0.0, cost=0.02)
    assert policy.order_group(cheap, NOW) != policy.order_group(dear, NOW)
    assert LruPolicy().order_group(cheap, NOW) is None
