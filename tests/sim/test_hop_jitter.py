"""The hop's measured spread (``CostModel.hop_jitter_s``): read, written, refused, drawn."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from sim_inputs import calibration_measured, cost

from loraplex.sim.calibrate import jitter_quantiles
from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import from_dict, load
from loraplex.sim.run import simulate
from loraplex.sim.trace import TraceRecord

SPREAD = (-0.002, 0.0, 0.001, 0.004, 0.030)  # quantiles at 0, 25, 50, 75, 100 %


def _warm_trace(n: int = 40) -> list[TraceRecord]:
    """One adapter, requests 1 s apart: after the first, every request is a lone warm one."""
    return [TraceRecord(float(i), "t", "a", 16, 4) for i in range(n)]


def test_the_quantiles_round_trip_and_interpolate(tmp_path: Path) -> None:
    model = replace(cost(), hop_jitter_s=SPREAD)
    model.save(tmp_path / "j.json")
    assert load(tmp_path / "j.json") == model
    assert model.hop_jitter(0.0) == -0.002
    assert model.hop_jitter(0.5) == pytest.approx(0.001)
    assert model.hop_jitter(0.875) == pytest.approx(0.017)  # halfway from 0.004 to 0.030
    assert model.hop_jitter(0.999999) == pytest.approx(0.030, abs=1e-6)
    plain = cost()
    assert plain.hop_jitter(0.9) == 0.0
    assert "hop_jitter_s" not in json.loads(plain.to_json())  # old files read as before


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([0.001], "hop_jitter_s"),
        ([0.002, 0.001], "ascending"),
        ([0.0, "slow"], "list of numbers"),
        (0.001, "list of numbers"),
    ],
)
def test_bad_quantiles_are_refused_by_name(value: object, message: str) -> None:
    body = json.loads(cost().to_json())
    body["hop_jitter_s"] = value
    with pytest.raises(ValueError, match=message):
        from_dict(body)


def test_quantiles_of_measured_residuals() -> None:
    residuals = [0.003, -0.001, 0.0, 0.010, -0.002]
    points = jitter_quantiles(residuals, points=5)
    assert points == pytest.approx((-0.002, -0.001, 0.0, 0.003, 0.010))
    assert jitter_quantiles([0.0, 1.0], points=3) == pytest.approx((0.0, 0.5, 1.0))
    with pytest.raises(ValueError, match="residuals"):
        jitter_quantiles([0.001])


def test_each_request_draws_its_own_hop_and_runs_repeat_exactly() -> None:
    """Without the spread every warm request's TTFT is the same; with it they spread over the
    measured range, around the same median, and the same inputs still give the same result."""
    trace = _warm_trace()
    plain = simulate(trace, SimConfig(), cost()).metrics
    jittered_model = replace(cost(), hop_jitter_s=SPREAD)
    jittered = simulate(trace, SimConfig(), jittered_model)
    warm_plain, warm = plain["ttft_ms_warm"], jittered.metrics["ttft_ms_warm"]
    assert warm_plain["p50"] == warm_plain["p99"]  # a deterministic hop: one value
    assert warm["p99"] - warm["p50"] > 5  # the 30 ms tail shows
    assert warm["p50"] == pytest.approx(warm_plain["p50"] + 1.0, abs=2.0)  # median jitter 1 ms
    assert simulate(trace, SimConfig(), jittered_model).to_json() == jittered.to_json()
    other_seed = simulate(trace, SimConfig(seed=1), jittered_model).metrics["ttft_ms_warm"]
    assert other_seed != warm  # the draws follow the config's seed


def test_a_hop_never_goes_below_zero() -> None:
    model = replace(cost(), front_s=0.0, ipc_s=0.0, hop_jitter_s=(-1.0, -1.0))
    plain = replace(cost(), front_s=0.0, ipc_s=0.0)
    trace = _warm_trace(5)
    floored = simulate(trace, SimConfig(), model).to_json()
    assert floored == simulate(trace, SimConfig(), plain).to_json()


def test_a_calibration_writes_the_spread_of_its_lone_requests(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``calibrate`` turns the lone warm requests' residuals into ``hop_jitter_s`` and cites
    them; a calibration without them writes no spread."""
    from loraplex.bench.sim import calibration
    from loraplex.bench.sim.calibrate_run import CalibrateConfig
    from loraplex.bench.sim.calibrate_target import Target

    residuals = [-0.002, 0.0, 0.0, 0.001, 0.006]
    measured = calibration_measured()
    measured.update(cold=[], residuals=residuals)
    monkeypatch.setattr(calibration, "measure", lambda target, config: dict(measured))
    target = Target("http://x", "k", (), {}, 100)
    model, report = calibration.calibrate(target, CalibrateConfig(), "hw", "cmd")
    assert model.hop_jitter_s == jitter_quantiles(residuals)
    assert "5 lone warm requests" in model.sources["hop_jitter_s"]
    assert report["hop_residuals_s"] == residuals
    model.save(tmp_path / "m.json")
    assert load(tmp_path / "m.json").hop_jitter_s == model.hop_jitter_s
    measured["residuals"] = []
    bare, _ = calibration.calibrate(target, CalibrateConfig(), "hw", "cmd")
    assert bare.hop_jitter_s == () and "not measured" in bare.sources["hop_jitter_s"]
