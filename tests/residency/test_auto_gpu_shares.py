"""Automatic GPU pins respect the tenants' shares (``default_tenant_tier_share`` of the GPU
tier): a tenant whose several adapters top the request rates holds at most its share of the
``max_auto_gpu_slots`` seats while another tenant's revision qualifies for one; seats no one else
wants it borrows (work-conserving, as ``residency/reclaim.py`` shares room). Before the fix the
seats went by rate alone, so one tenant's traffic took every one of them."""

from __future__ import annotations

import pytest
from cache_kit import UNIT, key

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.clock import ManualClock
from loraplex.residency.cache.config import CacheConfig
from loraplex.residency.cache.jobs import JobTable
from loraplex.residency.cache.tier_state import TierState
from loraplex.residency.ledger import Tier, TierBudget
from loraplex.residency.policy import make_policy
from loraplex.residency.warm import AutoWarmConfig, PinBook, RequestRates, seat_share

# A handful of requests a minute qualifies for gpu (0.02/s over 5 minutes).
AUTO = AutoWarmConfig(gpu_rps=0.02, cpu_rps=0.002, hysteresis=0.5)
ACME = [key("acme", f"hot{i}") for i in range(4)]
GLOBEX = key("globex", "steady")


def _state(max_auto_gpu: int, share: float) -> tuple[TierState, ManualClock]:
    clock = ManualClock(100.0)
    budgets = {
        Tier.L0: TierBudget(8 * UNIT, 8, default_tenant_share=share),
        Tier.L1: TierBudget(100 * UNIT, default_tenant_share=share),
        Tier.L2: TierBudget(100 * UNIT, default_tenant_share=share),
    }
    config = CacheConfig(budgets, auto_warm=AUTO, max_auto_gpu_slots=max_auto_gpu)
    jobs = JobTable(config.max_concurrent_loads, config.tenant_max_concurrent_loads)
    state = TierState(config, make_policy("cost_aware"), clock, jobs, lambda tier, k, slot: None)
    return state, clock


def _minutes(state: TierState, clock: ManualClock, traffic: dict[AdapterKey, int], n: int) -> None:
    """``n`` minutes of ``traffic`` (requests a minute per revision), a rebalance after each."""
    for _ in range(n):
        for adapter, count in traffic.items():
            for i in range(count):
                state.touch(adapter, clock.now() + i * 60.0 / count)
        clock.advance(60.0)
        state.rebalance_warm()


def _gpu(state: TierState, tenant: str) -> int:
    return sum(
        1
        for k in [*ACME, GLOBEX]
        if k.tenant == tenant and state.pins.warm_policy(k) is WarmPolicy.GPU
    )


def test_one_tenant_takes_no_more_than_its_share_while_another_has_steady_traffic() -> None:
    state, clock = _state(max_auto_gpu=4, share=0.5)
    # acme's four adapters are far hotter than globex's one, which still qualifies for gpu
    _minutes(state, clock, {**dict.fromkeys(ACME, 30), GLOBEX: 4}, 5)
    assert state.pins.warm_policy(GLOBEX) is WarmPolicy.GPU
    assert _gpu(state, "acme") == 3  # its share (2), and the seat no one else wants
    assert [state.pins.warm_policy(k) for k in ACME].count(WarmPolicy.CPU) == 1


def test_a_lone_tenant_borrows_every_seat_and_gives_one_back_when_another_qualifies() -> None:
    state, clock = _state(max_auto_gpu=4, share=0.5)
    _minutes(state, clock, dict.fromkeys(ACME, 30), 5)
    assert _gpu(state, "acme") == 4  # work-conserving: nobody else wants a seat
    # globex starts a steady trickle, far below acme's (incumbent) rates: the borrowed seat
    # goes to it all the same
    _minutes(state, clock, {**dict.fromkeys(ACME, 30), GLOBEX: 4}, 3)
    assert (_gpu(state, "acme"), _gpu(state, "globex")) == (3, 1)
    # globex goes quiet: once its revision falls below the gpu bar, acme takes the seat back
    _minutes(state, clock, dict.fromkeys(ACME, 30), 30)
    assert (_gpu(state, "acme"), _gpu(state, "globex")) == (4, 0)


def test_without_a_share_the_seats_go_by_rate_alone() -> None:
    state, clock = _state(max_auto_gpu=4, share=1.0)
    _minutes(state, clock, {**dict.fromkeys(ACME, 30), GLOBEX: 4}, 5)
    assert (_gpu(state, "acme"), _gpu(state, "globex")) == (4, 0)


def _rates(per_5m: float) -> RequestRates:
    return RequestRates(per_5m, per_5m, per_5m, per_5m)


def test_each_tenant_keeps_one_seat_where_its_share_rounds_below_one() -> None:
    """Two seats at a quarter share: each tenant keeps one (its share rounds to 0 seats, and
    a share never refuses one copy), so the two hottest tenants hold one seat each."""
    book = PinBook(AUTO, max_auto_gpu=2, tenant_share=0.25)
    hot = {k: _rates(5.0) for k in ACME}
    changes = book.rebalance({**hot, GLOBEX: _rates(0.05), key("initech", "a"): _rates(0.04)})
    assert changes[GLOBEX] is WarmPolicy.GPU
    assert changes[key("initech", "a")] is WarmPolicy.CPU  # colder than globex's
    assert [changes[k] for k in ACME].count(WarmPolicy.GPU) == 1


def test_seats_held_by_unjudged_revisions_count_against_their_tenant() -> None:
    """A holder left out of a rebalance's rates (no history) keeps its seat and counts in its
    tenant's share."""
    book = PinBook(AUTO, max_auto_gpu=4, tenant_share=0.5)
    book.rebalance({ACME[0]: _rates(5.0), ACME[1]: _rates(5.0)})
    changes = book.rebalance({ACME[2]: _rates(9.0), ACME[3]: _rates(9.0), GLOBEX: _rates(0.05)})
    assert changes[GLOBEX] is WarmPolicy.GPU
    assert [changes[k] for k in ACME[2:]].count(WarmPolicy.GPU) == 1  # 2 held + 1 borrowed


def test_seat_share_rounds_down_to_at_least_one_seat() -> None:
    assert seat_share(4, 1.0) is None
    assert [seat_share(n, 0.5) for n in (0, 1, 2, 3, 4, 5)] == [1, 1, 1, 1, 2, 2]
    assert seat_share(8, 0.3) == 2
    with pytest.raises(ValueError, match="tenant_share 0"):
        PinBook(AUTO, max_auto_gpu=2, tenant_share=0.0)
