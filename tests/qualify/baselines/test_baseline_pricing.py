"""The comparators' arithmetic: operating points, replica counts, machines, scale-to-zero cold
starts against the TTFT objective, and an undefined cost when nothing passed."""

from __future__ import annotations

import pytest

from loraplex.qualify.baselines.priced import Footprint, price_in_context, price_separate
from loraplex.qualify.baselines.pricing import (
    LoadLevel,
    Sample,
    cold_share,
    correct_requests,
    latency_with_cold_starts,
    machines_for,
    operating_point,
    replicas_needed,
    saturated,
)
from loraplex.qualify.baselines.types import CellTraffic, Probe
from loraplex.qualify.cost import TOKEN_SHAPES, MachinePrice

PRICE = MachinePrice("test-machine", 3.6, "a round figure for the arithmetic")
GIB = 1 << 30


def level(concurrency: int, wall_s: float, ttfts: list[float | None]) -> LoadLevel:
    samples = tuple(Sample(t is not None, t, 0.01) for t in ttfts)
    return LoadLevel(concurrency, wall_s, samples)


def cell(demand: dict[str, float], *, requests: int = 100, wall_s: float = 100.0) -> CellTraffic:
    probes = [Probe(ref, "The team", " is here.") for ref in demand]
    return CellTraffic("c", TOKEN_SHAPES["short"], requests, wall_s, demand, 1.0, 0.05, probes)


def test_operating_point_takes_the_most_goodput_not_the_most_capacity() -> None:
    calm = level(1, 1.0, [0.1] * 4)  # 4 rps, all within 1 s
    busy = level(8, 1.0, [0.1] * 3 + [2.0] * 5)  # 8 rps, 3 of 8 within 1 s: goodput 3
    point = operating_point([busy, calm], ttft_slo_s=1.0, tpot_slo_s=0.05)
    assert (point.concurrency, point.capacity_rps, point.latency_pass_ratio) == (1, 4.0, 1.0)
    looser = operating_point([busy, calm], ttft_slo_s=5.0, tpot_slo_s=0.05)
    assert (looser.concurrency, looser.capacity_rps) == (8, 8.0)


def test_a_failed_request_fails_latency_and_capacity() -> None:
    lv = level(2, 2.0, [0.1, None, 0.1, 0.1])
    assert lv.completed_rps == 1.5
    assert lv.latency_pass_ratio(1.0, 0.05) == 0.75
    assert lv.latency_pass_ratio(1.0, 0.001) == 0.0  # TPOT 0.01 s misses a 1 ms objective


def test_every_adapter_needs_ceil_demand_over_capacity_replicas_and_at_least_one() -> None:
    demand = {"a": 0.3, "b": 10.0, "c": 0.0, "d": 3.0}
    assert replicas_needed(demand, 1.0, scale_to_zero=False) == {"a": 1, "b": 10, "c": 1, "d": 3}
    assert replicas_needed({"x": 0.3}, 0.1, scale_to_zero=False) == {"x": 3}  # no float creep


def test_scale_to_zero_leaves_idle_adapters_without_replicas() -> None:
    demand = {"a": 0.3, "c": 0.0}
    assert replicas_needed(demand, 1.0, scale_to_zero=True) == {"a": 1, "c": 0}


def test_no_capacity_cannot_serve_traffic() -> None:
    with pytest.raises(ValueError, match="cannot serve 'a'"):
        replicas_needed({"a": 1.0}, 0.0, scale_to_zero=False)


def test_machines_take_the_binding_resource_in_whole_machines() -> None:
    demand = {f"a{i}": 0.1 for i in range(100)}
    replicas = dict.fromkeys(demand, 1)
    # 100 replicas of 1 GiB on 16 GiB machines: 6.25 by memory; 10 rps over 20 rps: 0.5.
    out = machines_for(demand, replicas, 20.0, GIB, 16 * GIB)
    assert out.by_compute == pytest.approx(0.5)
    assert (out.by_memory, out.machines) == (6.25, 7)
    heavy = machines_for({"a": 50.0}, {"a": 3}, 20.0, GIB, 16 * GIB)
    assert (heavy.by_compute, heavy.machines) == (2.5, 3)
    assert machines_for({"a": 0.0}, {"a": 0}, 20.0, GIB, 16 * GIB).machines == 0


def test_cold_share_counts_first_requests_only_under_scale_to_zero() -> None:
    demand = {"hot": 1.0, "rare": 0.001, "idle": 0.0}  # over 100 s: 100, 0.1 and 0 requests
    assert cold_share(demand, 100.0, scale_to_zero=False) == 0.0
    # hot: 1 cold of 100; rare: every one of its 0.1 expected requests is cold.
    assert cold_share(demand, 100.0, scale_to_zero=True) == pytest.approx(1.1 / 100.1)


def test_cold_start_beyond_the_ttft_objective_fails_the_cold_requests() -> None:
    assert latency_with_cold_starts(0.9, 0.25, cold_start_s=20.0, ttft_slo_s=1.0) == (
        pytest.approx(0.9 * 0.75)
    )
    assert latency_with_cold_starts(0.9, 0.25, cold_start_s=0.5, ttft_slo_s=1.0) == (
        pytest.approx(0.9)
    )


def test_correct_requests_is_undefined_when_a_ratio_is() -> None:
    assert correct_requests(100, [1.0, None]) is None
    assert correct_requests(100, [0.5, 0.5]) == 25
    assert correct_requests(10, [0.7, 1.0]) == 7


def footprint(rps: float = 10.0, ttft_s: float = 0.1) -> Footprint:
    return Footprint([level(4, 1.0, [ttft_s] * int(rps))], GIB, 16 * GIB)


def test_separate_prices_one_deployment_per_adapter() -> None:
    demand = {f"t/a{i}@r1": 0.5 for i in range(20)}  # 20 deployments, 10 rps in all
    judged = {p: True for p in cell(demand).probes}
    result = price_separate(PRICE, cell(demand), footprint(), 30.0, judged, scale_to_zero=False)
    assert result.method == "separate"
    assert result.pass_ratios == {
        "correct_revision": 1.0,
        "quality": 1.0,
        "latency": 1.0,
        "isolation": 1.0,
    }
    assert result.terms["replicas"] == 20
    assert result.machines == 2.0  # 20 GiB of replicas on 16 GiB machines
    # 3.6 USD/h * 2 machines * 100 s / 100 correct requests
    assert result.cost_per_correct_request == pytest.approx(0.002)
    assert "by construction" in str(result.terms["correct_revision"])


def test_scale_to_zero_saves_idle_replicas_and_pays_cold_starts_in_latency() -> None:
    demand = {"t/hot@r1": 0.99, "t/idle@r1": 0.0, "t/rare@r1": 0.001}
    traffic = cell(demand, requests=100, wall_s=100.0)
    judged = dict.fromkeys(traffic.probes, True)
    always = price_separate(PRICE, traffic, footprint(), 30.0, judged, scale_to_zero=False)
    to_zero = price_separate(PRICE, traffic, footprint(), 30.0, judged, scale_to_zero=True)
    assert (always.terms["replicas"], to_zero.terms["replicas"]) == (3, 2)
    assert to_zero.terms["deployments_at_zero"] == 1
    assert always.pass_ratios["latency"] == 1.0
    cold = 1.1 / 99.1  # hot's first request and rare's 0.1 expected ones
    assert to_zero.pass_ratios["latency"] == pytest.approx(1.0 - cold)
    fast = price_separate(PRICE, traffic, footprint(), 0.5, judged, scale_to_zero=True)
    assert fast.pass_ratios["latency"] == 1.0  # a cold start within the objective costs nothing


def test_cost_is_null_when_nothing_passed() -> None:
    demand = {"t/a@r1": 1.0}
    traffic = cell(demand)
    failed = dict.fromkeys(traffic.probes, False)
    result = price_separate(PRICE, traffic, footprint(), 30.0, failed, scale_to_zero=False)
    assert result.pass_ratios["quality"] == 0.0
    assert result.cost_per_correct_request is None
    assert result.terms["correct_requests"] == 0
    unjudged = dict.fromkeys(traffic.probes, None)
    unknown = price_separate(PRICE, traffic, footprint(), 30.0, unjudged, scale_to_zero=False)
    assert unknown.pass_ratios["quality"] is None
    assert unknown.cost_per_correct_request is None
    dead = Footprint([level(1, 1.0, [None, None])], GIB, 16 * GIB)  # nothing ever completed
    nothing = price_separate(PRICE, traffic, dead, 30.0, failed, scale_to_zero=False)
    assert nothing.cost_per_correct_request is None and nothing.terms["replicas"] is None


def test_in_context_serves_all_traffic_on_base_replicas() -> None:
    demand = {f"t/a{i}@r1": 2.0 for i in range(10)}  # 20 rps over 10 rps per replica
    traffic = cell(demand)
    judged = {p: i % 2 == 0 for i, p in enumerate(traffic.probes)}
    result = price_in_context(PRICE, traffic, footprint(), judged, {"extra": 1})
    assert result.pass_ratios["quality"] == 0.5
    assert result.pass_ratios["correct_revision"] is None
    assert result.pass_ratios["isolation"] is None
    assert (result.terms["replicas"], result.machines) == (2, 2.0)
    assert result.terms["correct_requests"] == 50
    assert result.cost_per_correct_request == pytest.approx(3.6 * 2 * (100 / 3600) / 50)


def test_a_sweep_still_climbing_at_its_top_level_is_not_saturated() -> None:
    climbing = [level(1, 1.0, [0.1] * 2), level(2, 1.0, [0.1] * 4), level(4, 1.0, [0.1] * 8)]
    assert not saturated(climbing)
    plateau = [level(1, 1.0, [0.1] * 2), level(2, 1.0, [0.1] * 8), level(4, 1.0, [0.1] * 8)]
    assert saturated(plateau)
    assert not saturated([level(1, 1.0, [0.1])])  # one level says nothing
