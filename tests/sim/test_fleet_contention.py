"""A fleet's measured contention (``fleet_contention``): the curve, its file key, what the
simulator charges with it, and its fit (the measuring side:
tests/bench/test_sim_calibrate_fleet.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from sim_inputs import cost

from loraplex.sim.calibrate_fleet import ContentionSample, fit_contention, round_ttfts
from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import from_dict, load
from loraplex.sim.cpu import Contention
from loraplex.sim.run import simulate
from loraplex.sim.trace import TraceRecord

CURVE = Contention((1, 2, 4, 8), (1.0, 1.5, 2.5, 5.0))


def _burst(n: int = 24) -> list[TraceRecord]:
    """``n`` requests on 6 adapters within 10 ms: many in flight at once."""
    return [TraceRecord(0.1 + i * 0.0004, "t", f"a{i % 6}", 16, 8) for i in range(n)]


def test_the_curve_interpolates_and_extends_its_last_segment() -> None:
    assert [CURVE.at(n) for n in (0, 1, 2, 3, 8)] == [1.0, 1.0, 1.5, 2.0, 5.0]
    assert CURVE.at(12) == pytest.approx(7.5)  # 0.625 per request past 8
    falling = Contention((1, 2, 4), (1.0, 3.0, 2.0))
    assert falling.at(10) == 2.0  # a falling last segment is held flat past its end


@pytest.mark.parametrize(
    ("in_flight", "stretch"),
    [
        ((1,), (1.0,)),  # one point
        ((1, 2), (1.0,)),  # lengths differ
        ((2, 4), (1.0, 2.0)),  # not from 1
        ((1, 4, 2), (1.0, 2.0, 3.0)),  # not ascending
        ((1, 2), (1.2, 2.0)),  # not 1 at one request
        ((1, 2), (1.0, 0.5)),  # a speed-up
        ((1, 2), (1.0, float("nan"))),
    ],
)
def test_a_bad_curve_is_refused_by_name(
    in_flight: tuple[int, ...], stretch: tuple[float, ...]
) -> None:
    with pytest.raises(ValueError, match="fleet_contention"):
        Contention(in_flight, stretch)


def test_the_key_round_trips_and_a_file_without_it_has_none(tmp_path: Path) -> None:
    model = replace(cost(), fleet_contention=CURVE)
    model.save(tmp_path / "f.json")
    assert load(tmp_path / "f.json") == model
    assert json.loads(model.to_json())["fleet_contention"] == {
        "in_flight": [1, 2, 4, 8],
        "stretch": [1.0, 1.5, 2.5, 5.0],
    }
    assert "fleet_contention" not in json.loads(cost().to_json())
    assert cost().fleet_contention is None


@pytest.mark.parametrize(
    "value",
    [
        [1, 2],
        {"in_flight": [1, 2]},
        {"in_flight": [1, 2], "stretch": [1.0, 2.0], "extra": 1},
        {"in_flight": [1, 2.5], "stretch": [1.0, 2.0]},
        {"in_flight": [1, 2], "stretch": [1.0, "x"]},
        {"in_flight": [1, 2], "stretch": [1.0, 0.9]},
    ],
)
def test_a_bad_key_is_refused_by_name(value: object) -> None:
    body = json.loads(cost().to_json())
    body["fleet_contention"] = value
    with pytest.raises(ValueError, match="fleet_contention"):
        from_dict(body)


def test_without_the_key_or_with_a_flat_curve_a_fleet_runs_as_before() -> None:
    """Files without the key give byte-identical results; a flat curve (no slowdown measured)
    charges nothing either."""
    fleet = SimConfig(replicas=3)
    before = simulate(_burst(), fleet, cost()).to_json()
    flat = replace(cost(), fleet_contention=Contention((1, 8), (1.0, 1.0)))
    assert simulate(_burst(), fleet, flat).to_json() == before
    reread = from_dict(json.loads(cost().to_json()))
    assert simulate(_burst(), fleet, reread).to_json() == before


def test_the_curve_slows_a_burst_in_a_fleet_only_and_runs_repeat() -> None:
    fleet, single = SimConfig(replicas=3), SimConfig()
    curved = replace(cost(), fleet_contention=CURVE)
    plain = simulate(_burst(), fleet, cost()).metrics
    slowed = simulate(_burst(), fleet, curved)
    assert slowed.metrics["ttft_ms"]["p50"] > 1.5 * plain["ttft_ms"]["p50"]
    assert slowed.metrics["throughput_requests_per_s"] < plain["throughput_requests_per_s"]
    assert simulate(_burst(), fleet, curved).to_json() == slowed.to_json()
    lone = [TraceRecord(float(i), "t", "a", 16, 4) for i in range(10)]  # one in flight at a time
    assert simulate(lone, fleet, curved).to_json() == simulate(lone, fleet, cost()).to_json()
    assert (
        simulate(_burst(), single, curved).to_json() == simulate(_burst(), single, cost()).to_json()
    )


def test_the_curve_replaces_the_cores_count_in_a_fleet() -> None:
    fleet = SimConfig(replicas=3)
    flat = Contention((1, 8), (1.0, 1.0))
    with_cores = simulate(_burst(), fleet, replace(cost(), cores=1)).metrics["ttft_ms"]
    both = simulate(_burst(), fleet, replace(cost(), cores=1, fleet_contention=flat))
    assert both.to_json() == simulate(_burst(), fleet, cost()).to_json()
    assert with_cores["p50"] > both.metrics["ttft_ms"]["p50"]


def test_the_fit_is_the_slowdown_per_request_over_the_median_round() -> None:
    rates = {1: (10.0, 9.0, 11.0), 2: (16.0, 15.0, 17.0), 4: (20.0,), 8: (19.0, 21.0)}
    samples = [ContentionSample(k, r) for k, rs in rates.items() for r in rs]
    curve, raw = fit_contention(samples)
    assert curve.in_flight == (1, 2, 4, 8)
    assert curve.stretch == pytest.approx((1.0, 2 * 10 / 16, 4 * 10 / 20, 8 * 10 / 20))
    assert raw == pytest.approx(curve.stretch)


def test_the_rounds_ttft_is_the_median_over_rounds_and_none_where_not_recorded() -> None:
    samples = [ContentionSample(1, 10.0, 0.05), ContentionSample(1, 9.0, 0.07)]
    samples += [ContentionSample(2, 15.0, 0.09), ContentionSample(2, 16.0)]
    assert round_ttfts(samples) == {1: pytest.approx(0.06), 2: None}


def test_a_faster_than_lone_round_is_floored_and_too_few_counts_refused() -> None:
    curve, raw = fit_contention([ContentionSample(1, 10.0), ContentionSample(2, 25.0)])
    assert (curve.stretch, raw[1]) == ((1.0, 1.0), pytest.approx(0.8))
    with pytest.raises(ValueError, match="in_flight"):
        fit_contention([ContentionSample(2, 10.0), ContentionSample(4, 12.0)])
    with pytest.raises(ValueError, match="in_flight"):
        fit_contention([ContentionSample(1, 10.0)])
    with pytest.raises(ValueError, match="ContentionSample"):
        ContentionSample(1, 0.0)
