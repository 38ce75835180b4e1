"""A full calibration whose step fit does not hold together is re-measured once, then refused
unless accepted explicitly (``bench/sim/fit_check.py``; docs/simulator.md, "SIMCAL2")."""

from __future__ import annotations

import json
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sim_inputs import calibration_measured

from loraplex.bench.sim import calibration
from loraplex.bench.sim.calibrate_run import CalibrateConfig
from loraplex.bench.sim.calibrate_target import Target
from loraplex.bench.sim.fit_check import (
    MAX_STEP_REL_RESIDUAL,
    MIN_STEP_R_SQUARED,
    BrokenFit,
    step_fit_faults,
)
from loraplex.sim.calibrate import Fit, StepFit, StepSample, fit_step
from loraplex.sim.cost_model import StepCost

TARGET = Target("http://x", "k", (), {}, 100)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"


def _measured(steps: list[StepSample]) -> dict[str, Any]:
    measured = calibration_measured()
    measured.update(steps=steps, step_fit=fit_step(steps), cold=[], residuals=[])
    measured["ttft_prefills"] = [s for s in steps if s.hop]
    return measured


def _clean() -> list[StepSample]:
    return list(calibration_measured()["steps"])


def _flat_prefill() -> list[StepSample]:
    """Prefill samples that shrink with the prompt (a disturbed run): NNLS prices the prompt
    token at 0, as in three kept files (03b, 03d, simwarm3)."""
    return [replace(s, step_s=0.008 - 5e-5 * s.prefill_tokens) if s.hop else s for s in _clean()]


def _broken_tpot() -> list[StepSample]:
    """One decode mix timed at 8 us a token (the broken TPOT of simval-paced, probe1/2)."""
    steps = _clean()
    steps[5] = replace(steps[5], step_s=8e-6)
    return steps


def test_a_clean_fit_has_no_fault() -> None:
    assert step_fit_faults(fit_step(_clean())) == []


def test_each_fault_is_named() -> None:
    assert "per_prefill_token_s fitted to 0" in step_fit_faults(fit_step(_flat_prefill()))
    faults = step_fit_faults(fit_step(_broken_tpot()))
    assert any(f.startswith("largest residual") and "beyond 1000%" in f for f in faults), faults


def test_the_bounds_are_where_they_say() -> None:
    step = StepCost(0.002, 1e-4, 3e-4, 1e-7, per_prefill_token_s=2e-5)

    def fitted(r2: float | None, worst: float, **prices: float) -> StepFit:
        return StepFit(replace(step, **prices), 0.001, Fit((), r2, worst))

    assert step_fit_faults(fitted(MIN_STEP_R_SQUARED, MAX_STEP_REL_RESIDUAL)) == []
    assert step_fit_faults(fitted(None, 0.1)) == []  # samples that do not vary: no R^2
    assert step_fit_faults(fitted(0.6499, 0.1)) == [f"R^2 0.6499 below {MIN_STEP_R_SQUARED}"]
    assert step_fit_faults(fitted(0.9, 10.01)) == ["largest residual 1001.0% beyond 1000%"]
    assert step_fit_faults(fitted(0.9, 0.1, per_token_s=0.0)) == ["per_token_s fitted to 0"]
    both = fitted(0.5, 20.0, per_prefill_token_s=0.0)
    assert len(step_fit_faults(both)) == 3


def _stub(monkeypatch: pytest.MonkeyPatch, first: list[StepSample], again: list[StepSample]):
    calls: list[int] = []

    def remeasure(target: Target, config: CalibrateConfig, measured: dict) -> dict:
        calls.append(1)
        return {**measured, **_measured(again)}

    monkeypatch.setattr(calibration, "measure", lambda target, config: _measured(first))
    monkeypatch.setattr(calibration, "remeasure_steps", remeasure)
    return calls


def test_a_clean_calibration_is_not_remeasured(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _stub(monkeypatch, _clean(), _flat_prefill())
    model, report = calibration.calibrate(TARGET, CalibrateConfig(), "hw", "cmd")
    assert calls == []
    assert model.sources["fit_check"].endswith("): held")
    assert report["fit_check"]["measurements"] == [[]]
    assert "first_step_samples" not in report["fit_check"]


def test_a_broken_fit_is_remeasured_once_and_the_second_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _stub(monkeypatch, _flat_prefill(), _clean())
    model, report = calibration.calibrate(TARGET, CalibrateConfig(), "hw", "cmd")
    assert calls == [1]
    assert model.step.per_prefill_token_s == pytest.approx(2e-5)  # the second measurement's
    assert "per_prefill_token_s fitted to 0" in model.sources["fit_check"]
    assert "the step samples measured once more and held" in model.sources["fit_check"]
    assert report["fit_check"]["measurements"][1] == []
    first = report["fit_check"]["first_step_samples"]
    assert [s["step_s"] for s in first] == [s.step_s for s in _flat_prefill()]
    assert [s["step_s"] for s in report["step_samples"]] == [s.step_s for s in _clean()]


def test_a_fit_broken_twice_is_refused_unless_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _stub(monkeypatch, _flat_prefill(), _broken_tpot())
    with pytest.raises(BrokenFit, match="largest residual") as raised:
        calibration.calibrate(TARGET, CalibrateConfig(), "hw", "cmd")
    assert calls == [1]
    assert raised.value.report["fit_check"]["accepted"] is False
    assert "not written" in raised.value.report["fit_check"]["text"]
    model, report = calibration.calibrate(
        TARGET, CalibrateConfig(), "hw", "cmd", accept_broken_fit=True
    )
    assert calls == [1, 1]
    assert model.sources["fit_check"].endswith("; kept by --accept-broken-fit")
    assert report["fit_check"]["accepted"] is True


def _cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *flags: str):
    from typer.testing import CliRunner

    from loraplex.cli import app, sim_calibrate

    monkeypatch.setattr(sim_calibrate, "_target", lambda *a, **k: nullcontext(TARGET))
    args = ["sim", "calibrate", "--url", "http://x", "--admin-key", "k", "--hardware", "hw"]
    out, report = tmp_path / "cost.json", tmp_path / "samples.json"
    result = CliRunner().invoke(app, [*args, "--out", str(out), "--report", str(report), *flags])
    return result, out, report


def test_sim_calibrate_writes_no_model_for_a_broken_fit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _stub(monkeypatch, _flat_prefill(), _flat_prefill())
    result, out, report = _cli(monkeypatch, tmp_path)
    assert result.exit_code == 1, result.output
    assert "per_prefill_token_s fitted to 0" in result.output
    assert "--accept-broken-fit" in result.output
    assert not out.exists()
    kept = json.loads(report.read_text(encoding="utf-8"))  # the samples, to look into
    assert kept["fit_check"]["measurements"] == [["per_prefill_token_s fitted to 0"]] * 2


def test_sim_calibrate_accept_broken_fit_writes_it_and_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _stub(monkeypatch, _flat_prefill(), _flat_prefill())
    result, out, _ = _cli(monkeypatch, tmp_path, "--accept-broken-fit")
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text(encoding="utf-8"))
    assert written["step"]["per_prefill_token_s"] == 0.0
    assert "kept by --accept-broken-fit" in written["sources"]["fit_check"]


def test_remeasure_steps_measures_the_steps_again_and_keeps_the_loads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loads and cold requests are not re-measured (their adapters are no longer cold);
    every step measurement is replaced by the second's."""
    first = _measured(_flat_prefill())
    again = {k: v for k, v in _measured(_clean()).items() if k not in ("loads", "cold")}
    monkeypatch.setattr(calibration, "with_sizes", lambda client, target: target)
    monkeypatch.setattr(calibration, "_step_measurements", lambda client, target, config: again)
    out = calibration.remeasure_steps(TARGET, CalibrateConfig(), first)
    assert out["loads"] is first["loads"] and out["cold"] is first["cold"]
    assert out["step_fit"] is again["step_fit"] and out["steps"] is again["steps"]
    assert out["handoffs"] is None  # no request log


def test_bench_sims_in_run_calibration_keeps_its_report_then_refuses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``bench sim`` without ``--cost-model``: a fit broken twice keeps the calibration's report
    in ``--logs-dir`` (with the checks) and raises, so no trace is priced with it."""
    from loraplex.bench.sim import calibrate_target
    from loraplex.cli import bench_sim

    _stub(monkeypatch, _flat_prefill(), _flat_prefill())
    monkeypatch.setattr(calibrate_target, "self_target", lambda *a, **k: nullcontext(TARGET))
    with pytest.raises(BrokenFit, match="per_prefill_token_s fitted to 0"):
        bench_sim._calibrated(tmp_path, 8, "hw", tmp_path)
    kept = json.loads((tmp_path / "calibration.samples.json").read_text(encoding="utf-8"))
    assert kept["fit_check"]["accepted"] is False
    assert len(kept["fit_check"]["measurements"]) == 2


def _fleet_samples(network_s: float) -> list:
    """Lone requests through a fleet over ``sim_inputs.cost()``: their TTFT the base's lone
    price plus ``network_s`` (below 0: faster than the base predicts), one decode request."""
    from sim_inputs import cost

    from loraplex.sim.calibrate_fleet import FleetSample

    base = cost()
    out = []
    for length in (8, 32):
        sample = FleetSample(length, 8, 4096, 1.0)
        lone = base.front_s + base.ipc_s + sample.prefill_price_s(base)
        out += [replace(sample, ttft_s=max(1e-4, lone + network_s)) for _ in range(3)]
    decode = FleetSample(8, 8, 4096, 1.0, 1.0)
    return [*out, replace(decode, tpot_s=decode.decode_price_s(base))]


def test_a_fleet_fit_whose_hop_is_floored_at_0_is_measured_once_more(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from sim_inputs import cost

    from loraplex.bench.sim import calibrate_fleet
    from loraplex.bench.sim.fit_check import fleet_fit_faults
    from loraplex.sim.calibrate_fleet import fit_fleet

    base = cost()
    floored = fit_fleet(base, _fleet_samples(-0.002))
    assert floored.network_s == 0.0
    assert fleet_fit_faults(floored) == ["network_s fitted to 0 (raw median -2.00 ms)"]
    assert fleet_fit_faults(fit_fleet(base, _fleet_samples(0.004))) == []
    runs = [_fleet_samples(-0.002), _fleet_samples(0.004)]
    calls: list[int] = []

    def measure_fleet(config: object, asset_dir: Path) -> tuple:
        calls.append(1)
        return (runs[len(calls) - 1], [], 0, {}, [])

    monkeypatch.setattr(calibrate_fleet, "measure_fleet", measure_fleet)
    config = calibrate_fleet.FleetCalibrateConfig()
    measured, checks = calibrate_fleet.checked_measurements(base, config, tmp_path)
    assert calls == [1, 1] and measured[0] is runs[1]
    assert checks == [["network_s fitted to 0 (raw median -2.00 ms)"], []]
    calls.clear()
    runs.reverse()  # the first holds: measured once
    measured, checks = calibrate_fleet.checked_measurements(base, config, tmp_path)
    assert calls == [1] and checks == [[]]


def _fleet_cli(tmp_path: Path, base: Path, *flags: str):
    from typer.testing import CliRunner

    from loraplex.cli import app

    args = ["sim", "calibrate-fleet", "--base", str(base), "--out", str(tmp_path / "o.json")]
    return CliRunner().invoke(app, [*args, "--report", str(tmp_path / "r.json"), *flags])


def test_calibrate_fleet_refuses_a_base_whose_fit_failed_unless_accepted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A base whose recorded step fit fails the check (here 03b's: prefill priced at 0) is
    refused by name before any fleet starts; accepted, it is measured over."""
    from loraplex.bench.sim import calibrate_fleet

    base = DOCS / "sim-cost-cpu-2core-demo-small-2026-12-03b.json"
    seen: list[bool] = []

    def fake(base_model, config, asset_dir, command, *, accept_broken_fit=False):
        seen.append(accept_broken_fit)
        return base_model, {"fit_check": {}}

    monkeypatch.setattr(calibrate_fleet, "calibrate_fleet", fake)
    result = _fleet_cli(tmp_path, base)
    assert result.exit_code == 2, result.output
    assert "per_prefill_token_s fitted to 0" in result.output and seen == []
    assert not (tmp_path / "o.json").exists()
    result = _fleet_cli(tmp_path, base, "--accept-broken-fit")
    assert result.exit_code == 0, result.output
    assert seen == [True] and (tmp_path / "o.json").exists()


def test_calibrate_fleet_writes_no_model_for_a_fleet_fit_broken_twice(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from sim_inputs import COST_FILE

    from loraplex.bench.sim import calibrate_fleet

    def fake(base_model, config, asset_dir, command, *, accept_broken_fit=False):
        raise BrokenFit(["network_s fitted to 0 (raw median -2.00 ms)"], {"fit_check": 1}, "fleet")

    monkeypatch.setattr(calibrate_fleet, "calibrate_fleet", fake)
    result = _fleet_cli(tmp_path, COST_FILE)
    assert result.exit_code == 1, result.output
    assert "the fleet fit does not hold together" in result.output
    assert not (tmp_path / "o.json").exists()
    assert json.loads((tmp_path / "r.json").read_text(encoding="utf-8")) == {"fit_check": 1}


def test_calibrate_fleet_refuses_a_fit_broken_twice_unless_accepted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``calibrate_fleet`` end to end over stubbed measurements (no Ray), the contention fit by
    simulation stubbed to its first pass: broken twice it raises with the report; accepted,
    the model's ``sources.fleet_fit_check`` says so."""
    from sim_inputs import cost

    from loraplex.bench.sim import calibrate_fleet
    from loraplex.bench.sim.contention_fit import ContentionFit
    from loraplex.bench.sim.contention_rounds import Placement
    from loraplex.sim.calibrate_fleet import ContentionSample
    from loraplex.sim.host_speed import HostProbe

    rounds = [ContentionSample(1, 10.0), ContentionSample(2, 15.0)]
    probes = [HostProbe(0.3, 0.2)] * 2
    where = {"adapters": ["a"], "placed_on": None}
    calls: list[int] = []

    def measure_fleet(config: object, asset_dir: Path) -> tuple:
        calls.append(1)
        return (_fleet_samples(-0.002), rounds, 0, where, probes)

    monkeypatch.setattr(calibrate_fleet, "measure_fleet", measure_fleet)
    monkeypatch.setattr(
        calibrate_fleet, "simulated_rounds", lambda *a, **k: (None, None, Placement())
    )
    monkeypatch.setattr(
        calibrate_fleet,
        "fit_by_simulation",
        lambda model, config, shape, measured, first: ContentionFit(first, 1, {}, {}, {}, 0.0),
    )
    config = calibrate_fleet.FleetCalibrateConfig()
    with pytest.raises(BrokenFit, match="the fleet fit does not hold") as raised:
        calibrate_fleet.calibrate_fleet(cost(), config, tmp_path, "cmd")
    assert calls == [1, 1]
    assert len(raised.value.report["fit_check"]["measurements"]) == 2
    model, report = calibrate_fleet.calibrate_fleet(
        cost(), config, tmp_path, "cmd", accept_broken_fit=True
    )
    assert model.network_s == 0.0
    assert model.sources["fleet_fit_check"].endswith("; kept by --accept-broken-fit")
    assert report["fit_check"]["accepted"] is True


def test_the_cost_file_the_readme_and_the_timeline_scripts_name_passes_the_check() -> None:
    """The example cost file (README's `sim run`, scripts/sim-timeline/probe.py and the timeline
    scripts' test) is one whose step fit, refitted from its kept samples, holds together: the
    undated file they named before fails it (SIMCAL2's table; docs/simulator.md, SIMCOLD)."""
    import re

    repo = DOCS.parents[1]
    named = set()
    for text in (
        "README.md",
        "scripts/sim-timeline/probe.py",
        "tests/sim/test_sim_timeline_scripts.py",
    ):
        found = re.findall(
            r'(?:--cost-model |COST = ")docs/benchmarks/(sim-cost-[\w.-]+?)\.json',
            (repo / text).read_text(),
        )
        assert found, text
        named |= set(found)
    for stem in sorted(named):
        rows = json.loads((DOCS / f"{stem}-samples.json").read_text())["step_samples"]
        assert step_fit_faults(fit_step([StepSample(**row) for row in rows])) == [], stem
