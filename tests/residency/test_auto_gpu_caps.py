"""Automatic GPU seats respect each tenant's own GPU byte cap (``max_gpu_bytes``): a revision
whose L0 copy its tenant's cap would refuse (beside the copies its seats and GPU pins already
hold) is given no seat, and the seat goes to the next revision by rank. Before the fix a tenant
capped below its seat share was handed seats whose loads its cap refused, so they sat waiting
while another tenant's qualifying revision was refused the seat. Also: an operator setting
clears the revision's automatic policy (it was left behind and still counted as a held seat)."""

from __future__ import annotations

from cache_kit import UNIT, key

from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.clock import ManualClock
from loraplex.residency.cache.config import CacheConfig
from loraplex.residency.cache.jobs import JobTable
from loraplex.residency.cache.tier_state import TierState
from loraplex.residency.ledger import Tier, TierBudget
from loraplex.residency.pipeline import Footprint, Resolved
from loraplex.residency.policy import make_policy
from loraplex.residency.warm import AutoWarmConfig, PinBook, RequestRates

AUTO = AutoWarmConfig(gpu_rps=0.02, cpu_rps=0.002, hysteresis=0.5)
ACME = [key("acme", f"hot{i}") for i in range(3)]
GLOBEX = key("globex", "steady")


def _rates(per_5m: float) -> RequestRates:
    return RequestRates(per_5m, per_5m, per_5m, per_5m)


def _sizes(size: int = UNIT) -> dict[object, int]:
    return dict.fromkeys([*ACME, GLOBEX], size)


def test_a_capped_tenant_gets_no_seat_its_cap_would_refuse() -> None:
    book = PinBook(AUTO, max_auto_gpu=2, tenant_share=1.0)
    rates = {**{k: _rates(5.0) for k in ACME}, GLOBEX: _rates(0.05)}
    sizes = _sizes()
    # acme may hold one copy in GPU slots: one seat, the next goes to globex (colder)
    changes = book.rebalance(rates, gpu_caps={"acme": UNIT}, gpu_bytes=sizes.get)
    assert [changes[k] for k in ACME].count(WarmPolicy.GPU) == 1
    assert changes[GLOBEX] is WarmPolicy.GPU
    # without the cap the seats go by rate alone, as before
    uncapped = PinBook(AUTO, max_auto_gpu=2).rebalance(rates, gpu_bytes=sizes.get)
    assert [uncapped[k] for k in ACME].count(WarmPolicy.GPU) == 2
    assert uncapped[GLOBEX] is WarmPolicy.CPU


def test_a_cap_below_one_copy_gets_no_seat_and_a_share_does_not_override_it() -> None:
    book = PinBook(AUTO, max_auto_gpu=4, tenant_share=0.5)
    rates = {**{k: _rates(5.0) for k in ACME}, GLOBEX: _rates(0.05)}
    changes = book.rebalance(rates, gpu_caps={"acme": UNIT - 1}, gpu_bytes=_sizes().get)
    assert {changes[k] for k in ACME} == {WarmPolicy.CPU}
    assert changes[GLOBEX] is WarmPolicy.GPU


def test_gpu_pins_and_held_seats_count_against_the_cap() -> None:
    book = PinBook(AUTO, max_auto_gpu=4)
    book.pin(ACME[0], Tier.L0)  # an operator pin holds one copy of acme's two
    sizes = _sizes()
    caps = {"acme": 2 * UNIT}
    changes = book.rebalance({ACME[1]: _rates(5.0)}, gpu_caps=caps, gpu_bytes=sizes.get)
    assert changes[ACME[1]] is WarmPolicy.GPU
    # ACME[1] holds its seat unjudged (no rates this time): ACME[2] would pass the cap
    changes = book.rebalance({ACME[2]: _rates(9.0)}, gpu_caps=caps, gpu_bytes=sizes.get)
    assert changes[ACME[2]] is WarmPolicy.CPU
    # a lowered cap takes the seat back at the next judgement
    changes = book.rebalance({ACME[1]: _rates(5.0)}, gpu_caps={"acme": UNIT}, gpu_bytes=sizes.get)
    assert changes[ACME[1]] is WarmPolicy.CPU


def test_a_revision_of_unknown_size_is_seated_only_while_its_tenant_has_room() -> None:
    book = PinBook(AUTO, max_auto_gpu=4)
    rates = {ACME[0]: _rates(5.0)}
    assert book.rebalance(rates, gpu_caps={"acme": 0}, gpu_bytes=lambda k: None) == {
        ACME[0]: WarmPolicy.CPU
    }
    assert book.rebalance(rates, gpu_caps={"acme": 1}, gpu_bytes=lambda k: None) == {
        ACME[0]: WarmPolicy.GPU
    }


def test_an_operator_setting_clears_the_automatic_policy_and_frees_its_seat() -> None:
    book = PinBook(AUTO, max_auto_gpu=1)
    assert book.rebalance({ACME[0]: _rates(5.0)}) == {ACME[0]: WarmPolicy.GPU}
    book.set_operator(ACME[0], WarmPolicy.ON_DEMAND)
    assert ACME[0] not in book.due()  # its automatic policy is gone, not held behind the setting
    # the seat it held is free: another revision takes it (it was refused: a stale held seat)
    assert book.rebalance({ACME[1]: _rates(0.05)}) == {ACME[1]: WarmPolicy.GPU}
    book.set_operator(ACME[0], None)  # automatic again: judged afresh at the next rebalance
    assert ACME[0] in book.due()
    assert book.warm_policy(ACME[0]) is WarmPolicy.ON_DEMAND


def test_the_cache_state_passes_its_gpu_caps_and_footprints() -> None:
    clock = ManualClock(100.0)
    budgets = {
        Tier.L0: TierBudget(8 * UNIT, 8, tenant_max_bytes={"acme": UNIT}),
        Tier.L1: TierBudget(100 * UNIT),
        Tier.L2: TierBudget(100 * UNIT),
    }
    config = CacheConfig(budgets, auto_warm=AUTO, max_auto_gpu_slots=2)
    jobs = JobTable(config.max_concurrent_loads, config.tenant_max_concurrent_loads)
    state = TierState(config, make_policy("cost_aware"), clock, jobs, lambda tier, k, slot: None)
    for k in [*ACME, GLOBEX]:
        state.remember_footprint(k, Resolved(Footprint(UNIT, UNIT, UNIT), {}))
    for _ in range(5):
        for k, per_minute in [*((k, 30) for k in ACME), (GLOBEX, 4)]:
            for i in range(per_minute):
                state.touch(k, clock.now() + i * 60.0 / per_minute)
        clock.advance(60.0)
        state.rebalance_warm()
    assert [state.pins.warm_policy(k) for k in ACME].count(WarmPolicy.GPU) == 1
    assert state.pins.warm_policy(GLOBEX) is WarmPolicy.GPU
