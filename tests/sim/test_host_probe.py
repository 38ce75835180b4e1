"""The host-speed probe (``sim/host_speed.py``, ``bench/sim/host_probe.py``): recorded by a
calibration beside its figures (``host_probe``, an optional cost-model key refused by name when
malformed; a file without it reads and writes as before), timed before each of ``bench sim``'s
real runs and reported as a ratio, never applied to the prices."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from loraplex.bench.sim import host_probe as probe_module
from loraplex.bench.sim.bench import host_report
from loraplex.sim.cost_model import from_dict, load
from loraplex.sim.host_speed import HostProbe, probe_ratio

EXAMPLE = Path(__file__).resolve().parent / "cost_example.json"


def test_a_file_without_the_key_reads_and_writes_byte_for_byte() -> None:
    model = load(EXAMPLE)
    assert model.host_probe is None
    assert "host_probe" not in json.loads(model.to_json())
    assert load(EXAMPLE).to_json() == model.to_json()
    probed = replace(model, host_probe=HostProbe(0.31, 0.29))
    body = json.loads(probed.to_json())
    assert body["host_probe"] == {"matmul_s": 0.31, "loop_s": 0.29}
    assert from_dict(body) == probed
    del body["host_probe"]
    assert from_dict(body).to_json() == model.to_json()


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"matmul_s": 0.3}, "host_probe must be an object of matmul_s and loop_s"),
        ({"matmul_s": 0.3, "loop_s": 0.2, "x": 1}, "host_probe must be an object"),
        ([0.3, 0.2], "host_probe must be an object"),
        ({"matmul_s": 0.0, "loop_s": 0.2}, r"host_probe: host_probe\.matmul_s must be finite"),
        ({"matmul_s": 0.3, "loop_s": "fast"}, r"host_probe\.loop_s must be a number"),
        ({"matmul_s": 0.3, "loop_s": True}, r"host_probe\.loop_s must be a number"),
    ],
)
def test_a_malformed_probe_is_refused_by_name(value: object, named: str) -> None:
    body = json.loads(EXAMPLE.read_text())
    body["host_probe"] = value
    with pytest.raises(ValueError, match=named):
        from_dict(body)


def test_the_ratio_and_the_report_per_trace() -> None:
    then = HostProbe(0.3, 0.2)
    assert probe_ratio(HostProbe(0.6, 0.4), then) == pytest.approx(2.0)
    runs = {"fleet": {"hot-burst": [HostProbe(0.3, 0.2), HostProbe(0.45, 0.3), HostProbe(1, 1)]}}
    report = host_report(then, runs)
    assert report["ratio"] == {"fleet": {"hot-burst": 1.5}}  # the median of 1, 1.5, 4
    assert report["calibration"] == {"matmul_s": 0.3, "loop_s": 0.2}
    assert report["runs"]["fleet"]["hot-burst"][1] == {"matmul_s": 0.45, "loop_s": 0.3}
    assert host_report(None, runs)["ratio"] == {"fleet": {"hot-burst": None}}  # never 1


def test_the_probe_times_its_fixed_work_and_restores_torch_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(probe_module, "MATMUL_ITERS", 20)
    monkeypatch.setattr(probe_module, "LOOP_ITERS", 20_000)
    threads = torch.get_num_threads()
    probe = probe_module.host_probe(repeats=1)
    assert probe.matmul_s > 0 and probe.loop_s > 0
    assert torch.get_num_threads() == threads
    with pytest.raises(ValueError, match="repeats"):
        probe_module.host_probe(repeats=0)


def test_a_calibration_records_the_probe_around_its_measurements(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Timed before and after the measurements; the file holds their mean per part, the report
    both."""
    from sim_inputs import calibration_measured

    from loraplex.bench.sim import calibration
    from loraplex.bench.sim.calibrate_run import CalibrateConfig
    from loraplex.bench.sim.calibrate_target import Target

    timings = iter([HostProbe(0.2, 0.1), HostProbe(0.4, 0.3)])
    order: list[str] = []
    measured = calibration_measured()
    measured.update(cold=[], residuals=[])

    def probe() -> HostProbe:
        order.append("probe")
        return next(timings)

    def measure(target: object, config: object) -> dict[str, object]:
        order.append("measure")
        return dict(measured)

    monkeypatch.setattr(calibration, "host_probe", probe)
    monkeypatch.setattr(calibration, "measure", measure)
    model, report = calibration.calibrate(
        Target("http://x", "k", (), {}, 100), CalibrateConfig(), "hw", "cmd"
    )
    assert order == ["probe", "measure", "probe"]
    assert model.host_probe is not None
    assert (model.host_probe.matmul_s, model.host_probe.loop_s) == pytest.approx((0.3, 0.2))
    assert report["host_probes"] == [
        {"matmul_s": 0.2, "loop_s": 0.1}, {"matmul_s": 0.4, "loop_s": 0.3},
    ]  # fmt: skip
    assert "before and after" in model.sources["host_probe"]
