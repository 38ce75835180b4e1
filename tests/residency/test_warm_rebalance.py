"""Automatic warm-policy rebalancing judges only the keys whose policy can change: the same
decisions as judging every key with a history, at a cost that does not grow with idle copies."""

from __future__ import annotations

import pytest
from cache_kit import UNIT, key
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.clock import ManualClock
from loraplex.residency.cache.config import CacheConfig
from loraplex.residency.cache.jobs import JobTable
from loraplex.residency.cache.tier_state import TierState
from loraplex.residency.ledger import Tier, TierBudget
from loraplex.residency.policy import make_policy
from loraplex.residency.warm import AutoWarmConfig, RequestRates, RollingRates

KEYS = [key(t, f"w{i}") for t in ("p", "q") for i in range(4)]
# Low thresholds: a handful of requests promotes (6 in 5 minutes to gpu, 8 in an hour to cpu).
AUTO = AutoWarmConfig(gpu_rps=0.02, cpu_rps=0.002, hysteresis=0.5)


def _state(max_auto_gpu: int = 2, max_idle_keys: int = 3) -> tuple[TierState, ManualClock]:
    clock = ManualClock(100.0)
    budgets = {
        Tier.L0: TierBudget(100_000 * UNIT, 8),
        Tier.L1: TierBudget(100_000 * UNIT),
        Tier.L2: TierBudget(100_000 * UNIT),
    }
    config = CacheConfig(
        budgets, auto_warm=AUTO, max_auto_gpu_slots=max_auto_gpu, max_idle_keys=max_idle_keys
    )
    jobs = JobTable(config.max_concurrent_loads, config.tenant_max_concurrent_loads)
    state = TierState(config, make_policy("cost_aware"), clock, jobs, lambda tier, k, slot: None)
    return state, clock


def _full_scan(state: TierState) -> dict[AdapterKey, WarmPolicy]:
    """The rebalance before this change: every key with a history judged, in key order."""
    now = state.clock.now()
    return state.pins.rebalance({k: h.owner_rates.rates(now) for k, h in state.histories()})


ops = st.one_of(
    st.tuples(st.just("request"), st.sampled_from(KEYS), st.sampled_from([1, 3, 8, 20])),
    # another tenant's requests (a public adapter's callers): they earn the owner no seat
    st.tuples(st.just("caller"), st.sampled_from(KEYS), st.sampled_from([3, 20])),
    st.tuples(st.just("wait"), st.sampled_from([1.0, 60.0, 300.0, 3600.0, 20_000.0])),
    st.tuples(
        st.just("operator"),
        st.sampled_from(KEYS),
        st.sampled_from([None, WarmPolicy.GPU, WarmPolicy.CPU, WarmPolicy.ON_DEMAND]),
    ),
    st.tuples(st.just("settle"), st.sampled_from(KEYS)),  # may forget idle keys' histories
    st.tuples(st.just("recover"), st.sampled_from(KEYS)),  # a history without a request
    st.tuples(st.just("rebalance")),
)


def _apply(state: TierState, clock: ManualClock, op: tuple) -> None:  # type: ignore[type-arg]
    name, *args = op
    if name in ("request", "caller"):
        for _ in range(args[1]):
            state.touch(args[0], clock.now(), by_owner=name == "request")
    elif name == "wait":
        clock.advance(args[0])
    elif name == "operator":
        state.pins.set_operator(args[0], args[1])
    elif name == "settle":
        state.settle_key(args[0])
    elif name == "recover":
        state.restore_access(args[0], clock.now() - 5.0)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=st.lists(ops, min_size=10, max_size=60), max_auto_gpu=st.integers(0, 3))
def test_rebalancing_the_due_keys_decides_as_the_full_scan(
    steps: list[tuple],  # type: ignore[type-arg]
    max_auto_gpu: int,
) -> None:
    incremental, clock = _state(max_auto_gpu)
    reference, reference_clock = _state(max_auto_gpu)
    for step in steps:
        _apply(incremental, clock, step)
        _apply(reference, reference_clock, step)
        if step[0] == "rebalance":
            assert incremental.rebalance_warm() == _full_scan(reference)
    assert incremental.rebalance_warm() == _full_scan(reference)
    for k in KEYS:
        assert incremental.pins.warm_policy(k) is reference.pins.warm_policy(k)


class CountingRates(RollingRates):
    """Real rolling rates that count how often a rebalance reads them."""

    __slots__ = ("reads",)

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def rates(self, now_s: float) -> RequestRates:
        self.reads += 1
        return super().rates(now_s)


@pytest.mark.parametrize("n", [200, 2000])
def test_an_idle_rebalance_reads_the_promoted_keys_only(n: int) -> None:
    state, clock = _state(max_auto_gpu=2, max_idle_keys=n)
    copies = [key("p", f"c{i}") for i in range(n)]
    counters = [CountingRates() for _ in copies]
    for i, (k, counter) in enumerate(zip(copies, counters, strict=True)):
        state.history_of(k).owner_rates = counter  # what a rebalance reads
        for _ in range(10 if i < 5 else 1):  # five hot copies, the rest requested once
            state.touch(k, clock.now())
        state.mark_ready(state.reserve(Tier.L2, k, UNIT))
    promoted = state.rebalance_warm()
    assert len(promoted) == 5  # two to gpu (the cap), three to cpu
    clock.advance(30.0)
    for counter in counters:
        counter.reads = 0
    assert state.rebalance_warm() == {}
    assert sum(c.reads for c in counters) == 5  # O(promoted), whatever n is


def test_a_key_released_from_its_operator_setting_is_judged_again() -> None:
    state, clock = _state()
    hot = KEYS[0]
    state.pins.set_operator(hot, WarmPolicy.ON_DEMAND)
    for _ in range(20):
        state.touch(hot, clock.now())
    assert state.rebalance_warm() == {}  # the operator's setting wins
    clock.advance(1.0)
    assert state.rebalance_warm() == {}
    state.pins.set_operator(hot, None)  # no request since: still judged, still hot
    assert state.rebalance_warm() == {hot: WarmPolicy.GPU}
