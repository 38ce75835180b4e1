"""The incrementally maintained victim order: exactly the policy's sort of every evictable copy,
at a per-placement cost that does not grow with the number of cached copies."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice

import pytest
from cache_kit import UNIT, key
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loraplex.artifacts.identity import AdapterKey
from loraplex.clock import ManualClock
from loraplex.residency.cache import victim_index
from loraplex.residency.cache.config import CacheConfig
from loraplex.residency.cache.jobs import JobTable
from loraplex.residency.cache.placement import Demand, Place, decide
from loraplex.residency.cache.room import TierRoom
from loraplex.residency.cache.tier_state import TierState
from loraplex.residency.ledger import CACHED_TIERS, ResidentEntry, Tier, TierBudget
from loraplex.residency.pipeline import Footprint, Move, Resolved
from loraplex.residency.policy import Candidate, EvictionPolicy, OrderGroup, OrderKey, make_policy

HORIZON_S = 10.0
# Bytes per size unit in the property test: large enough that the bandwidth term of a reload
# cost rivals the fixed miss stall, so bandwidth swings reorder copies of different footprints.
BIG = 10**8
KEYS = [key(t, f"a{i}") for t in ("p", "q", "r") for i in range(6)]


@pytest.fixture(autouse=True, params=["small-tiers-sorted", "index-only"])
def _small_tiers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs as the cache does (tiers of at most SORT_AT_MOST copies sorted) and with
    the index alone answering every query, whatever the tier's size."""
    if request.param == "index-only":
        monkeypatch.setattr(victim_index, "SORT_AT_MOST", 0)


def _state(
    policy: EvictionPolicy, capacity: int = 10_000 * UNIT, slots: int = 64
) -> tuple[TierState, ManualClock]:
    clock = ManualClock(100.0)
    budgets = {
        Tier.L0: TierBudget(capacity, slots),
        Tier.L1: TierBudget(capacity),
        Tier.L2: TierBudget(capacity),
    }
    config = CacheConfig(budgets, victim_order_horizon_s=HORIZON_S)
    jobs = JobTable(config.max_concurrent_loads, config.tenant_max_concurrent_loads)
    return TierState(config, policy, clock, jobs, lambda tier, k, slot: None), clock


def _expected(state: TierState, tier: Tier) -> list[AdapterKey]:
    """The order before the index: every evictable copy ranked by the policy at once."""
    entries = state.ledgers[tier].entries.values()
    candidates = [state.candidate(e) for e in entries if e.evictable]
    return [c.key for c in state.policy.order_victims(candidates, state.clock.now())]


ops = st.one_of(
    st.tuples(st.just("reserve"), st.sampled_from(KEYS), st.sampled_from(CACHED_TIERS)),
    st.tuples(st.just("touch"), st.sampled_from(KEYS)),
    st.tuples(st.just("evict"), st.sampled_from(KEYS), st.sampled_from(CACHED_TIERS)),
    st.tuples(st.just("lease"), st.sampled_from(KEYS), st.sampled_from(CACHED_TIERS)),
    st.tuples(st.just("pin"), st.sampled_from(KEYS), st.sampled_from(CACHED_TIERS)),
    st.tuples(st.just("footprint"), st.sampled_from(KEYS), st.integers(1, 9)),
    st.tuples(st.just("bandwidth"), st.sampled_from(CACHED_TIERS), st.sampled_from([0.1, 3, 50])),
    st.tuples(st.just("priority"), st.sampled_from(["p", "q"]), st.sampled_from([0.25, 1, 4])),
    st.tuples(st.just("wait"), st.sampled_from([0.0, 0.1, 0.3, 2.0, 7.0, HORIZON_S + 1, 400.0])),
    st.tuples(st.just("query"), st.sampled_from(CACHED_TIERS), st.integers(0, 20)),
)


def _apply(state: TierState, clock: ManualClock, op: tuple) -> None:  # type: ignore[type-arg]
    name, *args = op
    entry = state.ledgers[args[1]].get(args[0]) if name in ("evict", "lease") else None
    if name == "reserve" and args[0] not in state.ledgers[args[1]].entries:
        size = (1 + KEYS.index(args[0]) % 4) * BIG
        state.mark_ready(state.reserve(args[1], args[0], size))
    elif name == "touch":
        state.touch(args[0], clock.now())
    elif name == "evict" and entry is not None and entry.evictable:
        state.evict(entry)
    elif name == "lease" and entry is not None:
        entry.refcount = 1 - entry.refcount  # leases do not enter the key: no note
    elif name == "pin":
        tiers = state.pins.pinned_tiers(args[0])
        (state.pins.unpin if args[1] in tiers else state.pins.pin)(args[0], args[1])
        state.refresh_pins(args[0])
    elif name == "footprint":
        n = args[1] * BIG
        state.remember_footprint(args[0], Resolved(Footprint(BIG, n, 2 * n), {}))
    elif name == "bandwidth":
        source = Tier(args[0] + 1)
        seconds = BIG / (state.costs.bandwidth(source) * args[1])
        for _ in range(20):  # the estimate is an average: move it far
            state.costs.measured(Move(KEYS[0], source, args[0]), BIG, seconds)
    elif name == "priority":
        weights = dict(state.config.tenant_priority) | {args[0]: float(args[1])}
        state.reconfigure(CacheConfig(state.config.budgets, tenant_priority=weights))
    elif name == "wait":
        clock.advance(args[0])
    elif name == "query":
        got = [e.key for e in islice(state.ranked_victims(args[0]), args[1])]
        assert got == _expected(state, args[0])[: args[1]]


@pytest.mark.parametrize("policy", ["cost_aware", "lru", "admit_gdsf"])
@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    copies=st.lists(
        st.tuples(st.sampled_from(KEYS), st.sampled_from(CACHED_TIERS)), min_size=5, max_size=30
    ),
    steps=st.lists(ops, min_size=20, max_size=80),
)
def test_lazy_order_equals_the_full_sort(
    policy: str,
    copies: list[tuple[AdapterKey, Tier]],
    steps: list[tuple],  # type: ignore[type-arg]
) -> None:
    """Random copies, requests, leases, pins, footprints, bandwidth swings, priority changes and
    times within and past the horizon; partly consumed queries; then every tier in full."""
    state, clock = _state(make_policy(policy), capacity=len(KEYS) * 4 * BIG, slots=len(KEYS))
    for k, tier in copies:
        _apply(state, clock, ("touch", k))
        _apply(state, clock, ("reserve", k, tier))
        clock.advance(0.05)
    for step in steps:
        _apply(state, clock, step)
        state.check()
    for tier in CACHED_TIERS:
        assert [e.key for e in state.ranked_victims(tier)] == _expected(state, tier)


# Copies nobody requests: two shapes, so a few groups of equal W hold many members each.
IDLE_KEYS = [key(t, f"z{i}") for t in ("p", "q", "r") for i in range(8)]
idle_ops = st.one_of(
    ops,
    st.tuples(st.just("idle_reserve"), st.sampled_from(IDLE_KEYS), st.sampled_from(CACHED_TIERS)),
    st.tuples(st.just("restore"), st.sampled_from(IDLE_KEYS), st.sampled_from([0.0, 0.0, 5.0])),
    st.tuples(st.just("touch"), st.sampled_from(IDLE_KEYS)),
    st.tuples(st.just("evict"), st.sampled_from(IDLE_KEYS), st.sampled_from(CACHED_TIERS)),
    st.tuples(st.just("lease"), st.sampled_from(IDLE_KEYS), st.sampled_from(CACHED_TIERS)),
    st.tuples(st.just("footprint"), st.sampled_from(IDLE_KEYS), st.integers(1, 2)),
    st.tuples(st.just("wait"), st.sampled_from([0.05, 0.15])),  # youth ends one by one
    st.tuples(st.just("query"), st.sampled_from(CACHED_TIERS), st.integers(0, 30)),
)


def _apply_idle(state: TierState, clock: ManualClock, op: tuple) -> None:  # type: ignore[type-arg]
    """``_apply`` plus copies that are never requested and whose last access is restored."""
    name, *args = op
    if name == "idle_reserve" and args[0] not in state.ledgers[args[1]].entries:
        size = (1 + IDLE_KEYS.index(args[0]) % 2) * BIG
        state.mark_ready(state.reserve(args[1], args[0], size))
    elif name == "restore":  # many copies share a last access (a recovery's file times)
        state.restore_access(args[0], 100.0 + args[1])
    else:
        _apply(state, clock, op)


@pytest.mark.parametrize("policy", ["cost_aware", "lru", "admit_gdsf"])
@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    copies=st.lists(
        st.tuples(st.sampled_from(IDLE_KEYS), st.sampled_from(CACHED_TIERS), st.integers(0, 2)),
        min_size=5,
        max_size=40,
    ),
    steps=st.lists(idle_ops, min_size=20, max_size=80),
)
def test_lazy_order_equals_the_full_sort_with_groups_of_idle_copies(
    policy: str,
    copies: list[tuple[AdapterKey, Tier, int]],
    steps: list[tuple],  # type: ignore[type-arg]
) -> None:
    """Many never-requested copies of equal W with equal or close last accesses (groups), some
    young, some requested or repriced later, among requested copies and priority changes."""
    state, clock = _state(make_policy(policy), capacity=len(IDLE_KEYS) * 8 * BIG, slots=64)
    for k, tier, step in copies:
        _apply_idle(state, clock, ("restore", k, float(step)))
        _apply_idle(state, clock, ("idle_reserve", k, tier))
        clock.advance(0.1 * step)  # some copies share a load time too; the last ones are young
    for step in steps:
        _apply_idle(state, clock, step)
        state.check()
    for tier in CACHED_TIERS:
        assert [e.key for e in state.ranked_victims(tier)] == _expected(state, tier)


class CountingPolicy:
    """A real policy that counts the true keys and floors the cache asks it for."""

    def __init__(self, inner: EvictionPolicy) -> None:
        self.inner = inner
        self.name = inner.name
        self.keys = 0
        self.floors = 0

    def order_key(self, c: Candidate, now_s: float) -> OrderKey:
        self.keys += 1
        return self.inner.order_key(c, now_s)

    def order_key_floor(self, c: Candidate, now_s: float, until_s: float) -> OrderKey:
        self.floors += 1
        return self.inner.order_key_floor(c, now_s, until_s)

    def order_group(self, c: Candidate, now_s: float) -> OrderGroup | None:
        return self.inner.order_group(c, now_s)

    def order_victims(self, candidates: Sequence[Candidate], now_s: float) -> list[Candidate]:
        self.keys += len(candidates)
        return self.inner.order_victims(candidates, now_s)

    def admits(self, incoming: Candidate, victims: Sequence[Candidate], now_s: float) -> bool:
        return self.inner.admits(incoming, victims, now_s)

    def deferral_s(
        self,
        incoming: Candidate,
        victims: Sequence[Candidate],
        held: Sequence[Candidate],
        waited_s: float,
        now_s: float,
    ) -> float:
        return self.inner.deferral_s(incoming, victims, held, waited_s, now_s)


def _full_l1(policy: str, n: int) -> tuple[TierState, ManualClock, CountingPolicy]:
    """``n`` copies filling L1, each last requested at its own time over the past ``n`` s."""
    counting = CountingPolicy(make_policy(policy))
    state, clock = _state(counting, capacity=n * UNIT)
    clock.advance(n)
    for i in range(n):
        k = key("p", f"c{i}")
        state.touch(k, 100.0 + i)
        state.mark_ready(state.reserve(Tier.L1, k, UNIT))
    clock.advance(1.0)  # past min_residency_s: no copy is young (young ones are all refined)
    return state, clock, counting


def _place(state: TierState, name: str) -> Place:
    k = key("q", name)
    state.touch(k, state.clock.now())
    room = TierRoom(state, Move(k, Tier.L2, Tier.L1), Footprint(UNIT, UNIT, UNIT), 0.0)
    placement = decide(Demand(k.ref, Tier.L1, False, True), room)
    assert isinstance(placement, Place)
    return placement


@pytest.mark.parametrize("policy", ["cost_aware", "lru"])
def test_a_placement_in_a_full_tier_computes_keys_for_its_victims_not_every_copy(
    policy: str,
) -> None:
    n = 2000
    state, clock, counting = _full_l1(policy, n)
    for i in range(6):
        expected = _expected(state, Tier.L1)[0]
        counting.keys = counting.floors = 0
        placement = _place(state, f"new{i}")
        assert [v.key for v in placement.victims] == [expected]
        assert counting.keys <= 30, counting.keys  # O(victims), not one per copy
        if i == 0 or i == 5:  # the first placement and the first past the horizon
            assert counting.floors >= n
        else:  # within the horizon only the changed copies get new floors
            assert counting.floors <= 2, counting.floors
        state.evict(placement.victims[0])
        state.mark_ready(state.reserve(Tier.L1, key("q", f"new{i}"), UNIT))
        clock.advance(HORIZON_S / 4.5 if i < 4 else HORIZON_S)


def test_requests_raise_the_floors_of_the_copies_they_heat() -> None:
    n = 2000
    state, clock, counting = _full_l1("cost_aware", n)
    _place(state, "first")  # builds the floors
    for i in range(200):  # the 200 coldest copies turn hot
        state.touch(key("p", f"c{i}"), clock.now())
    clock.advance(1.0)
    counting.keys = 0
    assert [v.key for v in _place(state, "second").victims] == [key("p", "c200")]
    assert counting.keys <= 30, counting.keys  # their old, low floors are gone


def test_a_small_full_tier_sorts_its_copies_by_their_keys() -> None:
    """A tier of at most SORT_AT_MOST copies (a few L0 slots) computes each copy's true key
    once per placement and no floor; the index answers larger tiers (and every tier here when
    the fixture turns sorting off)."""
    n = 4
    state, clock, counting = _full_l1("cost_aware", n)
    for i in range(3):
        expected = _expected(state, Tier.L1)[0]
        counting.keys = counting.floors = 0
        placement = _place(state, f"new{i}")
        assert [v.key for v in placement.victims] == [expected]
        if n <= victim_index.SORT_AT_MOST:
            assert (counting.keys, counting.floors) == (n, 0)
        else:
            assert counting.floors > 0
        state.evict(placement.victims[0])
        state.mark_ready(state.reserve(Tier.L1, key("q", f"new{i}"), UNIT))
        clock.advance(1.0)
        state.check()


def test_a_load_into_free_room_computes_no_key() -> None:
    counting = CountingPolicy(make_policy("cost_aware"))
    state, _ = _state(counting)
    for i in range(100):
        state.mark_ready(state.reserve(Tier.L1, key("p", f"c{i}"), UNIT))
    assert _place(state, "new").victims == ()
    assert counting.keys == counting.floors == 0


def test_an_iterator_is_refused_after_a_newer_query() -> None:
    state, _ = _state(make_policy("lru"))
    for k in KEYS[:3]:
        state.mark_ready(state.reserve(Tier.L1, k, UNIT))
    first = state.ranked_victims(Tier.L1)
    next(first)
    assert len(list(state.ranked_victims(Tier.L1))) == 3
    with pytest.raises(RuntimeError, match="newer query"):
        next(first)


def test_copies_evicted_while_iterating_leave_the_rest_in_order() -> None:
    state, clock = _state(make_policy("cost_aware"))
    for i, k in enumerate(KEYS):
        for _ in range(i):
            state.touch(k, clock.now())
        state.mark_ready(state.reserve(Tier.L2, k, UNIT))
    clock.advance(1.0)
    expected = _expected(state, Tier.L2)
    seen: list[AdapterKey] = []
    for entry in state.ranked_victims(Tier.L2):
        seen.append(entry.key)
        if entry.key.tenant == "p":
            state.evict(entry)
    assert seen == expected
    state.check()


def _victim_keys(victims: Sequence[ResidentEntry]) -> list[AdapterKey]:
    return [v.key for v in victims]


def test_a_tenant_over_its_cap_picks_its_own_copies_lazily() -> None:
    state, clock = _state(make_policy("lru"))
    ledger = state.ledgers[Tier.L1]
    ledger.set_tenant_caps({"p": 2 * UNIT})
    order = [key("q", "x"), key("p", "a"), key("q", "y"), key("p", "b")]
    for k in order:
        state.touch(k, clock.now())
        clock.advance(1.0)
        state.mark_ready(state.reserve(Tier.L1, k, UNIT))
    victims = ledger.plan_room("p", UNIT, lambda: state.ranked_victims(Tier.L1))
    assert victims is not None and _victim_keys(victims) == [key("p", "a")]


def test_config_rejects_a_horizon_and_priorities_the_order_cannot_bound() -> None:
    budgets = {t: TierBudget(UNIT, 1 if t is Tier.L0 else None) for t in CACHED_TIERS}
    with pytest.raises(ValueError, match="victim_order_horizon_s 0"):
        CacheConfig(budgets, victim_order_horizon_s=0)
    with pytest.raises(ValueError, match=r"tenant_priority\['p'\] -1"):
        CacheConfig(budgets, tenant_priority={"p": -1.0})


def test_a_placement_among_never_requested_copies_refines_group_heads_only() -> None:
    """2,000 copies nobody requested (as after a recovery), equal W, last accesses equal in
    runs of ten and otherwise close: each placement computes a few true keys, and a rebuild
    past the horizon a floor per group, not per copy."""
    n = 2000
    counting = CountingPolicy(make_policy("cost_aware"))
    state, clock = _state(counting, capacity=n * UNIT)
    for i in range(n):
        k = key("p", f"idle{i}")
        state.restore_access(k, 100.0 - 1.0 + (i // 10) * 1e-4)
        state.mark_ready(state.reserve(Tier.L1, k, UNIT))
    clock.advance(1.0)  # past min_residency_s
    for i in range(6):
        expected = _expected(state, Tier.L1)[0]
        counting.keys = counting.floors = 0
        placement = _place(state, f"new{i}")
        assert [v.key for v in placement.victims] == [expected]
        assert counting.keys <= 30, counting.keys
        assert counting.floors <= 10, counting.floors  # the group's head and the newcomers
        state.evict(placement.victims[0])
        state.mark_ready(state.reserve(Tier.L1, key("q", f"new{i}"), UNIT))
        clock.advance(HORIZON_S / 4.5 if i < 4 else HORIZON_S)
    state.check()


def test_placements_among_young_never_requested_copies_refine_group_heads_only() -> None:
    """Right after a recovery every copy is young (old by the horizon, so each floor is below
    every young key): placements then, and once their youth ended, stay O(victims)."""
    n = 2000
    counting = CountingPolicy(make_policy("cost_aware"))
    state, clock = _state(counting, capacity=n * UNIT)
    for i in range(n):
        k = key("p", f"idle{i}")
        state.restore_access(k, 50.0 + i * 1e-3)
        state.mark_ready(state.reserve(Tier.L1, k, UNIT))
        clock.advance(1e-5)
    for i in range(8):
        if i == 5:
            clock.advance(0.3)  # past min_residency_s: every member's youth group lapses
        expected = _expected(state, Tier.L1)[0]
        counting.keys = 0
        placement = _place(state, f"new{i}")
        assert [v.key for v in placement.victims] == [expected]
        assert counting.keys <= 30, counting.keys
        state.evict(placement.victims[0])
        state.mark_ready(state.reserve(Tier.L1, key("q", f"new{i}"), UNIT))
        clock.advance(0.01)
        state.check()


def test_a_copy_whose_youth_ends_leaves_its_youth_group() -> None:
    """Two young, never-requested copies rank by last access; once the one loaded first is
    old it goes first, although it was used later."""
    state, clock = _state(make_policy("cost_aware"))
    used_later, used_earlier = key("p", "later"), key("p", "earlier")
    state.restore_access(used_later, 110.0)
    state.mark_ready(state.reserve(Tier.L1, used_later, UNIT))
    clock.advance(0.2)
    state.restore_access(used_earlier, 100.0)
    state.mark_ready(state.reserve(Tier.L1, used_earlier, UNIT))
    clock.advance(0.01)
    assert [e.key for e in state.ranked_victims(Tier.L1)] == [used_earlier, used_later]
    clock.advance(0.1)  # only the first is past min_residency_s
    assert [e.key for e in state.ranked_victims(Tier.L1)] == [used_later, used_earlier]
    assert _expected(state, Tier.L1) == [used_later, used_earlier]
