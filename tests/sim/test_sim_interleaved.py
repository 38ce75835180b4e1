"""``bench sim --calibrate-interleaved``: passes merged, and each trace priced from its passes
(``bench/sim/interleaved.py``), on synthetic samples: no server runs here."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sim_inputs import calibration_measured

from loraplex.bench.sim.bench import run_sim_bench
from loraplex.bench.sim.calibrate_run import CalibrateConfig
from loraplex.bench.sim.calibrate_target import Target
from loraplex.bench.sim.config import SimBenchConfig
from loraplex.bench.sim.interleaved import (
    CalibrationPass,
    InterleavedCalibration,
    adjacent_passes,
    interleaved_pricing,
    merged,
    pass_config,
)
from loraplex.sim.calibrate import fit_step
from loraplex.sim.host_speed import HostProbe

PER_TOKEN_S = 1e-4  # calibration_measured's decode price at speed 1
PROBE = HostProbe(matmul_s=0.3, loop_s=0.2)


def _measured(speed: float, front_s: float = 0.001) -> dict[str, Any]:
    """``calibration_measured`` on a host ``speed`` times slower: every step scaled."""
    out = calibration_measured()
    steps = [replace(s, step_s=s.step_s * speed) for s in out["steps"]]
    out.update(
        steps=steps,
        ttft_prefills=[s for s in steps if s.hop],
        step_fit=fit_step(steps),
        front_s=front_s,
        cold=[],
        residuals=[0.0, 0.001],
        log_lines=[],
        handoffs=None,
    )
    return out


def _calibration(speeds: list[float]) -> InterleavedCalibration:
    calibration = InterleavedCalibration(Path("assets"), 4, "hw", 3)
    target = Target("http://x", "k", (), {}, 100, load_cpu_shared=True)
    for i, speed in enumerate(speeds):
        one = CalibrationPass(target, _measured(speed), (PROBE, PROBE), f"t{i}")
        calibration.passes.append(one)
    return calibration


def test_a_pass_takes_a_fraction_of_the_single_calibrations_samples() -> None:
    base = CalibrateConfig()
    assert pass_config(1) == base
    third = pass_config(3)
    assert (third.repeats, third.overhead_requests) == (1, 3)
    assert pass_config(100).overhead_requests == 2  # one lone request gives no spread
    assert replace(third, repeats=base.repeats, overhead_requests=8) == base
    with pytest.raises(ValueError, match="calibrate_interleaved 0 is invalid"):
        pass_config(0)


def test_merged_pools_every_pass_and_refits_the_step() -> None:
    slow, fast = _measured(3.0, front_s=0.003), _measured(1.0, front_s=0.001)
    both = merged([slow, fast])
    assert both["steps"] == slow["steps"] + fast["steps"]
    assert len(both["residuals"]) == 4
    assert both["front_s"] == pytest.approx(0.002)  # the median of the passes'
    assert slow["step_fit"].step.per_token_s == pytest.approx(3 * PER_TOKEN_S)
    assert fast["step_fit"].step.per_token_s == pytest.approx(PER_TOKEN_S)
    price = both["step_fit"].step.per_token_s
    assert PER_TOKEN_S * 1.2 < price < 3 * PER_TOKEN_S * 0.8  # between, neither pass's
    assert price == fit_step(both["steps"]).step.per_token_s
    with pytest.raises(ValueError, match="measures is empty"):
        merged([])


def test_merged_redoes_the_lease_handoffs_over_every_passs_request_log() -> None:
    at_once = {"output_tokens": 1, "tier": "L0", "engine": {"scheduled_s": 0.002}}
    waited = {
        "output_tokens": 1,
        "tier": "L3",
        "engine": {"scheduled_s": 0.050, "load_s": 0.040, "ready_s": 0.045},
    }
    first, second = _measured(1.0), _measured(1.0)
    first["log_lines"], second["log_lines"] = [at_once], [waited]
    both = merged([first, second])
    assert both["handoffs"] is not None  # neither log alone holds both kinds of request
    assert both["handoffs"].seconds == {"L3": pytest.approx(0.008)}


def test_each_run_lies_between_the_pass_before_it_and_the_one_after() -> None:
    assert adjacent_passes([0], 4) == [0, 1]
    assert adjacent_passes([2, 0], 4) == [0, 1, 2, 3]
    assert adjacent_passes([1, 2], 5) == [1, 2, 3]
    with pytest.raises(ValueError, match="run 3 is invalid"):
        adjacent_passes([3], 4)  # 4 passes surround 3 runs


def test_each_trace_is_priced_by_the_passes_around_its_runs() -> None:
    """Three runs between four passes, the host four times slower from the third pass on: the
    first trace keeps the fast price, the last the slow one, the middle one lies between, and
    the model of all passes is none of them."""
    calibration = _calibration([1.0, 1.0, 4.0, 4.0])
    order = [("single", "a"), ("single", "b"), ("single", "c")]
    whole, pricing, report = interleaved_pricing(calibration, order)
    price = {n: pricing("single", n).step.per_token_s for n in "abc"}
    assert price["a"] == pytest.approx(PER_TOKEN_S)
    assert price["c"] == pytest.approx(4 * PER_TOKEN_S)
    assert price["a"] < price["b"] < price["c"]
    assert price["a"] < whole.step.per_token_s < price["c"]
    assert report["adjacent"] == {"single": {"a": [0, 1], "b": [1, 2], "c": [2, 3]}}
    figures = [p["per_token_s"] for p in report["passes"]]
    assert figures == pytest.approx([PER_TOKEN_S, PER_TOKEN_S, 4 * PER_TOKEN_S, 4 * PER_TOKEN_S])
    assert [p["started"] for p in report["passes"]] == ["t0", "t1", "t2", "t3"]
    assert whole.host_probe == PROBE
    assert "passes [0, 1, 2, 3] of 4" in whole.sources["command"]


def test_a_trace_run_twice_is_priced_by_the_passes_around_both_runs() -> None:
    calibration = _calibration([1.0, 2.0, 2.0, 1.0, 1.0])
    order = [("single", "a"), ("single", "b"), ("single", "b"), ("single", "a")]
    _, pricing, report = interleaved_pricing(calibration, order)
    assert report["adjacent"]["single"] == {"a": [0, 1, 3, 4], "b": [1, 2, 3]}
    assert pricing("single", "a").step.per_token_s < pricing("single", "b").step.per_token_s


def test_interleaving_with_a_file_needs_both_targets() -> None:
    """With a file the passes price the single target and the file the fleet
    (test_sim_both_interleaved.py); one target alone is refused."""
    with pytest.raises(ValueError, match="calibrate_interleaved 2 is invalid with cost_model"):
        SimBenchConfig(cost_model=Path("c.json"), calibrate_interleaved=2, targets=("single",))
    with pytest.raises(ValueError, match="calibrate_interleaved -1 is invalid"):
        SimBenchConfig(calibrate_interleaved=-1)
    config = SimBenchConfig(calibrate_interleaved=3, scale=None)
    with pytest.raises(ValueError, match="a cost_model, an interleaved calibration, or both"):
        run_sim_bench(config, None, None)
