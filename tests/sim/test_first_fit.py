"""``sim calibrate --self`` measures a fresh server's one-time seconds (``first_load_s``,
``first_step_s``, ``first_hop_s``): its first request, a lone cold one, against the median of its
later lone cold requests of a comparable adapter size, each excess floored at 0; 0 with a reason
without a first request or on a server it did not start (``--url``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sim_inputs import calibration_measured

from loraplex.bench.sim.calibrate_cold import first_requests
from loraplex.bench.sim.calibrate_fit import cost_model_from
from loraplex.bench.sim.calibrate_run import CalibrateConfig
from loraplex.bench.sim.calibrate_target import Target
from loraplex.bench.sim.calibration import NOT_FRESH, _first_requests
from loraplex.bench.sim.interleaved import merged
from loraplex.sim.calibrate import FirstSample, fit_first
from loraplex.sim.cost_model import FIRST_KEYS, load
from loraplex.sim.host_speed import HostProbe

SIZES = {"t/a@r1": 1000, "t/b@r1": 1500, "t/big@r1": 9000}


def _sample(load_s: float, step_s: float, hop_s: float, nbytes: int = 1000) -> FirstSample:
    return FirstSample("t/a@r1", nbytes, load_s, step_s, hop_s)


def test_the_known_excess_is_recovered_over_the_later_median() -> None:
    later = [_sample(0.010, 0.004, 0.002), _sample(0.012, 0.005, 0.003), _sample(0.011, 0.006, 0.1)]
    fit = fit_first(_sample(0.031, 0.009, 0.012), later)
    assert fit.reason == ""
    assert fit.seconds == pytest.approx(
        {"first_load_s": 0.020, "first_step_s": 0.004, "first_hop_s": 0.009}
    )
    assert len(fit.later) == 3


def test_a_negative_excess_is_floored_and_far_sizes_are_left_out() -> None:
    later = [_sample(0.010, 0.004, 0.002), _sample(0.500, 0.5, 0.5, nbytes=9000)]
    fit = fit_first(_sample(0.005, 0.009, 0.001), later)
    assert fit.seconds == pytest.approx(
        {"first_load_s": 0.0, "first_step_s": 0.005, "first_hop_s": 0.0}
    )
    assert fit.later == (later[0],)  # 9000 bytes is beyond 2x of 1000
    alone = fit_first(_sample(0.005, 0.009, 0.001), later[1:])
    assert alone.seconds == dict.fromkeys(FIRST_KEYS, 0.0)
    assert "within 2x" in alone.reason


def test_a_missing_first_request_gives_zero_with_a_reason() -> None:
    fit = fit_first(None, [_sample(0.01, 0.01, 0.01)], "no log")
    assert fit.seconds == dict.fromkeys(FIRST_KEYS, 0.0)
    assert fit.reason == "no log"
    assert first_requests([], SIZES).reason == "the server's request log holds no request"
    warm = _line(0.0, "a", tier="L0", load_s=0.0)
    assert "not a lone cold (L3)" in first_requests([warm], SIZES).reason
    with pytest.raises(ValueError, match="size_ratio"):
        fit_first(None, [], size_ratio=0.5)


def _line(t_s: float, name: str, *, tier: str = "L3", load_s: float = 0.01, step: float = 0.004,
          outside: float = 0.002, latency: float = 0.05) -> dict[str, Any]:  # fmt: skip
    engine = {"scheduled_s": 0.02, "first_step_end_s": 0.02 + step, "load_s": load_s}
    return {
        "t_s": t_s, "tenant": "t", "adapter": f"{name}@r1", "tier": tier, "output_tokens": 1,
        "latency_s": latency, "ttft_s": 0.02 + step + outside, "engine": engine,
    }  # fmt: skip


def test_the_request_log_gives_lone_cold_requests_only() -> None:
    lines = [
        _line(1.0, "b", load_s=0.012, step=0.005, outside=0.003),  # later, comparable
        _line(0.0, "a", load_s=0.040, step=0.010, outside=0.020),  # the first by arrival
        _line(2.0, "a", load_s=0.010, step=0.003, outside=0.001),
        _line(3.0, "a", load_s=0.900, step=0.9, outside=0.9),  # overlapped: not lone
        _line(3.01, "b", tier="L0", load_s=0.0),
        _line(4.0, "big", load_s=0.5),  # 9x the first's bytes: not comparable
        _line(5.0, "a", tier="L1", load_s=0.002),  # not from L3
    ]
    fit = first_requests(lines, SIZES)
    assert fit.first is not None and fit.first.adapter == "t/a@r1"
    assert [s.load_s for s in fit.later] == [0.012, 0.010]
    assert fit.seconds == pytest.approx(
        {"first_load_s": 0.029, "first_step_s": 0.006, "first_hop_s": 0.018}
    )


def test_a_server_calibrate_did_not_start_is_not_fresh(tmp_path: Path) -> None:
    remote = Target("http://x", "k", (), {}, 100)
    assert _first_requests(remote, [_line(0.0, "a")], []).reason == NOT_FRESH


def _model(firsts: list[Any]) -> Any:
    measured = {**calibration_measured(), "cold": [], "residuals": [], "first": firsts}
    return cost_model_from(
        Target("http://x", "k", (), {}, 100), CalibrateConfig(), measured,
        probes=[HostProbe(0.1, 0.1)], hardware="hw", command="cmd",
    )  # fmt: skip


def test_the_cost_file_round_trip_keeps_every_field_and_the_report_the_samples(
    tmp_path: Path,
) -> None:
    later = [_sample(0.010, 0.004, 0.002)]
    model, report = _model([fit_first(_sample(0.031, 0.009, 0.012), later)])
    assert model.first_load_s == pytest.approx(0.021)
    assert "first request" in model.sources["first_load_s"]
    model.save(tmp_path / "cal.json")
    assert load(tmp_path / "cal.json") == model
    assert report["first_requests"][0]["first"]["load_s"] == 0.031
    assert report["first_requests"][0]["later"][0]["hop_s"] == 0.002
    remote, _ = _model([fit_first(None, (), NOT_FRESH)])
    for key in FIRST_KEYS:
        assert getattr(remote, key) == 0.0
        assert NOT_FRESH in remote.sources[key]
    none, _ = _model([])  # a measured dict without first requests (older callers)
    assert none.first_hop_s == 0.0 and "no fresh server" in none.sources["first_hop_s"]


def test_interleaved_passes_each_fresh_take_the_median_over_passes() -> None:
    later = [_sample(0.010, 0.004, 0.002)]
    passes = [
        {**calibration_measured(), "cold": [], "residuals": [], "first": [fit]}
        for fit in (
            fit_first(_sample(0.020, 0.004, 0.002), later),
            fit_first(_sample(0.030, 0.006, 0.004), later),
            fit_first(_sample(0.050, 0.008, 0.012), later),
            fit_first(None, (), "the server's request log holds no request"),
        )
    ]
    firsts = merged(passes)["first"]
    assert len(firsts) == 4
    model, _ = _model(firsts)
    assert model.first_load_s == pytest.approx(0.020)
    assert model.first_step_s == pytest.approx(0.002)
    assert model.first_hop_s == pytest.approx(0.002)
    assert "the median over passes" in model.sources["first_step_s"]


def test_the_first_load_sample_prices_the_load_when_loads_came_first() -> None:
    from loraplex.sim.calibrate import LoadSample, with_first_load

    loads = [
        LoadSample("L3_to_L2", 1000, 0.030),  # the server's first load
        LoadSample("L2_to_L1", 1000, 0.001),
        LoadSample("L3_to_L2", 1200, 0.010),
        LoadSample("L3_to_L2", 900, 0.012),
        LoadSample("L3_to_L2", 9000, 0.500),  # beyond 2x: left out
    ]
    fit = fit_first(_sample(0.011, 0.009, 0.012), [_sample(0.011, 0.004, 0.002)])
    assert fit.seconds["first_load_s"] == 0.0  # the request's load was not the first
    again = with_first_load(fit, loads)
    assert again.seconds["first_load_s"] == pytest.approx(0.019)
    assert again.seconds["first_step_s"] == fit.seconds["first_step_s"]
    assert again.loads == (loads[0], loads[2], loads[3])
    assert with_first_load(fit, loads[:2]) == fit  # no comparable later load
    unmeasured = fit_first(None, (), NOT_FRESH)
    assert with_first_load(unmeasured, loads) == unmeasured
    model, report = _model([again])
    assert model.first_load_s == pytest.approx(0.019)
    assert "first load" in model.sources["first_load_s"]
    assert report["first_requests"][0]["loads"][0]["seconds"] == 0.030
