"""``bench sim --cost-model FILE --calibrate-interleaved K --calibrate-fleet-interleaved K2``:
both interleavings in one invocation, each target priced by its own passes, and the rule that
leaves out a disturbed single pass (``bench/sim/bench.py``, ``interleaved.py``), on synthetic
samples: no server, no fleet, no Ray."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_sim_fleet_interleaved import _base
from test_sim_fleet_interleaved import _calibration as fleet_calibration
from test_sim_interleaved import PER_TOKEN_S
from test_sim_interleaved import _calibration as single_calibration

from loraplex.bench.serve.driver import DriveConfig
from loraplex.bench.sim import bench
from loraplex.bench.sim.config import SimBenchConfig
from loraplex.bench.sim.fleet_interleaved import InterleavedFleet
from loraplex.bench.sim.interleaved import (
    InterleavedCalibration,
    disturbed_passes,
    interleaved_pricing,
)
from loraplex.bench.sim.validate import RealSettings
from loraplex.bench.workloads import Workload
from loraplex.sim.cost_model import StepCost
from loraplex.sim.host_speed import HostProbe

PROBE = HostProbe(matmul_s=0.3, loop_s=0.2)
TRACES = ("zipf-longtail", "hot-burst")


class _FleetPasses(InterleavedFleet):
    """Records when each fleet pass would run instead of deploying a fleet."""

    def __init__(self, events: list[str]) -> None:
        super().__init__(2, _base())
        self.events = events

    def run_pass(self, target: Any, settings: RealSettings, drive: DriveConfig, root: Path) -> None:
        self.events.append("fleet pass")


def _order_of_events(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, between_targets: tuple[str, ...] | None
) -> list[str]:
    """The events of ``bench.real`` over both targets, two traces, repeats 1, with single
    passes (``between``) and fleet passes; servers, Ray and the probe stubbed."""
    from loraplex.bench.fleet import cluster
    from loraplex.bench.sim import host_probe, validate

    events: list[str] = []

    @contextmanager
    def local_cluster(num_cpus: int) -> Iterator[int]:
        events.append("ray up")
        yield 1234
        events.append("ray down")

    def outcome(kind: str) -> Any:
        def run(target: Any, workload: Workload, *_: Any, **__: Any) -> dict[str, Any]:
            events.append(f"{kind} {workload.name}")
            return {}

        return run

    monkeypatch.setattr(cluster, "local_cluster", local_cluster)
    monkeypatch.setattr(validate, "single_outcome", outcome("single"))
    monkeypatch.setattr(validate, "fleet_outcome", outcome("fleet"))
    monkeypatch.setattr(host_probe, "host_probe", lambda: PROBE)
    config = SimBenchConfig(traces=TRACES, scale=None, trace_requests=8)
    registry: Any = None
    bench.real(
        config, config.workloads(), registry, tmp_path, 100, run_order=[],
        between=lambda: events.append("single pass"), fleet_passes=_FleetPasses(events),
        between_targets=between_targets,
    )  # fmt: skip
    return events


def test_single_passes_go_around_the_single_runs_and_fleet_passes_around_the_fleet_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    events = _order_of_events(monkeypatch, tmp_path, ("single",))
    assert events == [
        "single pass", "single zipf-longtail", "single pass", "single hot-burst", "single pass",
        "ray up",
        "fleet pass", "fleet zipf-longtail", "fleet pass", "fleet hot-burst", "fleet pass",
        "ray down",
    ]  # fmt: skip


def test_without_a_file_the_single_passes_still_go_around_every_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``between_targets`` None (no --cost-model): a single pass before each run of both
    targets and one after the last, as before (the fleet passes beside them in the cluster)."""
    events = _order_of_events(monkeypatch, tmp_path, None)
    assert events == [
        "single pass", "single zipf-longtail", "single pass", "single hot-burst",
        "ray up",
        "fleet pass", "single pass", "fleet zipf-longtail",
        "fleet pass", "single pass", "fleet hot-burst", "fleet pass",
        "ray down", "single pass",
    ]  # fmt: skip


ORDER = [("single", "a"), ("single", "b"), ("fleet", "a"), ("fleet", "b")]


def test_each_target_is_priced_by_its_own_passes() -> None:
    """Two single runs between three single passes (the host 1.8 times slower from the third)
    and two fleet runs between three fleet passes (1.3 times slower from the third): the single
    traces take the single passes' prices, the fleet traces the file's lone-server terms with
    the fleet passes' lone terms, and the file is the whole model."""
    file_model = _base()
    config = SimBenchConfig(traces=TRACES, scale=None)
    prices = bench.pricings(
        config, ORDER, {}, cost_model=file_model, interleaved=single_calibration([1.0, 1.0, 1.8]),
        fleet_passes=fleet_calibration([1.0, 1.0, 1.3]),
    )  # fmt: skip
    single = {n: prices.adjacent("single", n).step.per_token_s for n in "ab"}
    assert single["a"] == pytest.approx(PER_TOKEN_S)
    assert PER_TOKEN_S < single["b"] < 1.8 * PER_TOKEN_S
    for n in "ab":  # the fleet: the file's step, never a single pass's
        assert prices.adjacent("fleet", n).step == file_model.step
        assert prices.adjacent("fleet", n).fleet_contention == file_model.fleet_contention
    assert prices.adjacent("fleet", "a").fleet_cpu_scale == pytest.approx(1.0, rel=0.02)
    assert (
        prices.adjacent("fleet", "b").fleet_cpu_scale
        > prices.adjacent("fleet", "a").fleet_cpu_scale
    )
    assert prices.whole is file_model
    assert prices.all_passes("fleet", "a").step == file_model.step
    all_single = prices.all_passes("single", "a").step.per_token_s
    assert single["a"] < all_single < 1.8 * PER_TOKEN_S
    (single_report, single_for), (fleet_report, fleet_for) = prices.reports
    assert (single_for, fleet_for) == (("single",), ("fleet",))
    assert single_report["adjacent"] == {"single": {"a": [0, 1], "b": [1, 2]}}
    assert fleet_report["adjacent"] == {"a": [0, 1], "b": [1, 2]}


def test_with_a_file_and_no_fleet_passes_the_fleet_keeps_the_files_model() -> None:
    file_model = _base()
    config = SimBenchConfig(traces=TRACES, scale=None)
    prices = bench.pricings(
        config, ORDER, {}, cost_model=file_model, interleaved=single_calibration([1.0, 2.0, 2.0]),
        fleet_passes=None,
    )  # fmt: skip
    assert prices.adjacent("fleet", "a") is file_model
    assert prices.all_passes("fleet", "b") is file_model
    assert prices.adjacent("single", "b").step.per_token_s == pytest.approx(2 * PER_TOKEN_S)
    assert [targets for _, targets in prices.reports] == [("single",)]


def test_without_a_file_the_passes_price_both_targets() -> None:
    """What --calibrate-interleaved alone did: every run between passes, both targets priced
    by them, the whole model all passes' merged."""
    config = SimBenchConfig(traces=TRACES, scale=None)
    prices = bench.pricings(
        config, ORDER, {}, cost_model=None,
        interleaved=single_calibration([1.0, 1.0, 1.0, 1.8, 1.8]), fleet_passes=None,
    )  # fmt: skip
    assert prices.adjacent("fleet", "b").step.per_token_s == pytest.approx(1.8 * PER_TOKEN_S)
    assert prices.adjacent("single", "a").step.per_token_s == pytest.approx(PER_TOKEN_S)
    assert [targets for _, targets in prices.reports] == [("single", "fleet")]


def test_a_file_with_interleaved_passes_needs_both_targets() -> None:
    for targets in (("single",), ("fleet",)):
        with pytest.raises(ValueError, match="calibrate_interleaved 2 is invalid with cost_model"):
            SimBenchConfig(cost_model=Path("c.json"), targets=targets, calibrate_interleaved=2)
    both = SimBenchConfig(
        cost_model=Path("c.json"), calibrate_interleaved=2, calibrate_fleet_interleaved=2
    )
    assert both.targets == ("single", "fleet")
    single = SimBenchConfig(targets=("single",), scale=None)
    with pytest.raises(ValueError, match="needs both targets"):
        bench.run_sim_bench(single, _base(), single_calibration([1.0, 1.0]))


def _steps(per_token_us: float, prefill_us: float | None = 50.0) -> StepCost:
    per_prefill = None if prefill_us is None else prefill_us * 1e-6
    return StepCost(0.002, per_token_us * 1e-6, 0.0, 0.0, per_prefill_token_s=per_prefill)


def test_a_clean_set_of_passes_leaves_none_out() -> None:
    """SIMCAL's hold 1 (239-316 us a decode token, prefill 62-71 us) and a two-fold spread."""
    assert disturbed_passes([_steps(239, 70.7), _steps(316, 61.5), _steps(299), _steps(241)]) == {}
    assert disturbed_passes([_steps(100), _steps(200), _steps(150)]) == {}
    assert disturbed_passes([_steps(100, None), _steps(120, None)]) == {}  # no prefill term


def test_a_pass_whose_fit_does_not_hold_together_is_named() -> None:
    """SIMCAL's hold 3: pass 0 at 634 us a decode token and prefill 0 beside 141-201 us."""
    hold3 = [_steps(634, 0.0), _steps(201, 57.8), _steps(141, 42.3), _steps(148, 54.1)]
    assert disturbed_passes(hold3) == {0: "per_prefill_token_s fitted to 0"}
    slow = disturbed_passes([_steps(150), _steps(160), _steps(500), _steps(155)])
    assert slow == {2: "per_token_s 500.0 us is more than 2x the passes' median 157.5 us"}
    prefill = disturbed_passes([_steps(150, 40), _steps(150, 45), _steps(150, 200)])
    assert list(prefill) == [2]
    assert prefill[2].startswith("per_prefill_token_s 200.0 us is more than 2x")
    assert disturbed_passes([_steps(100), _steps(1000)]) == {}  # two: their mean is the median


def test_a_disturbed_pass_is_left_out_of_every_model_and_recorded() -> None:
    """Four passes, the third with every price eight times the others': the trace after it and
    the merged model take the clean passes only, and the report names it and why."""
    calibration = single_calibration([1.0, 1.0, 8.0, 1.0])
    order = [("single", "a"), ("single", "b"), ("single", "c")]
    whole, pricing, report = interleaved_pricing(calibration, order)
    assert [d["pass"] for d in report["disturbed"]] == [2]
    assert "more than 2x the passes' median" in report["disturbed"][0]["why"]
    assert report["kept"] == [0, 1, 3]
    assert report["adjacent"]["single"] == {"a": [0, 1], "b": [1], "c": [3]}
    for n in "abc":
        assert pricing("single", n).step.per_token_s == pytest.approx(PER_TOKEN_S)
    assert whole.step.per_token_s == pytest.approx(PER_TOKEN_S)
    assert "passes [0, 1, 3] of 4" in whole.sources["command"]
    assert report["all_kept_passes_for"] == []


def _prefill_fitted_to_0(calibration: InterleavedCalibration, i: int) -> None:
    """Pass ``i``'s own fit with its prompt tokens priced at 0 (its samples unchanged)."""
    measured = calibration.passes[i].measured
    fit = measured["step_fit"]
    flat = replace(fit, step=replace(fit.step, per_prefill_token_s=0.0))
    calibration.passes[i] = replace(calibration.passes[i], measured={**measured, "step_fit": flat})


def test_a_run_whose_passes_are_both_left_out_is_priced_by_every_kept_pass() -> None:
    calibration = single_calibration([1.0, 1.0, 1.0, 1.0, 1.0])
    for i in (1, 2):  # the passes around run 1
        _prefill_fitted_to_0(calibration, i)
    order = [("single", n) for n in "abcd"]
    _, _, report = interleaved_pricing(calibration, order)
    assert report["kept"] == [0, 3, 4]
    assert report["adjacent"]["single"]["b"] == [0, 3, 4]
    assert report["all_kept_passes_for"] == [["single", "b"]]


def test_when_every_pass_is_disturbed_all_are_kept() -> None:
    calibration = single_calibration([1.0, 1.0])
    for i in (0, 1):
        _prefill_fitted_to_0(calibration, i)
    _, _, report = interleaved_pricing(calibration, [("single", "a")])
    assert report["kept"] == [0, 1]
    assert len(report["disturbed"]) == 2
