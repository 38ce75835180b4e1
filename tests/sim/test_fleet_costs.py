"""What a fleet adds to the cost model (``network_jitter_s``, ``fleet_cpu_scale``, ``cores``):
read, written, refused, charged; and the fleet calibration's fit (``sim/calibrate_fleet.py``)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from sim_inputs import cost

from loraplex.sim.calibrate_fleet import FleetSample, fit_fleet, fleet_model
from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import from_dict, load
from loraplex.sim.cpu import CpuShare
from loraplex.sim.run import simulate
from loraplex.sim.trace import TraceRecord

SPREAD = (0.0, 0.01, 0.02)


def _warm_trace(n: int = 30, tenants: int = 1) -> list[TraceRecord]:
    return [TraceRecord(float(i), f"t{i % tenants}", "a", 16, 4) for i in range(n)]


def _burst(n: int = 24) -> list[TraceRecord]:
    """``n`` requests on 6 adapters within 10 ms: many steps and hops at once."""
    return [TraceRecord(0.1 + i * 0.0004, "t", f"a{i % 6}", 16, 8) for i in range(n)]


def test_the_keys_round_trip_and_old_files_read_as_before(tmp_path: Path) -> None:
    model = replace(cost(), network_jitter_s=SPREAD, fleet_cpu_scale=1.5, cores=2)
    model.save(tmp_path / "f.json")
    assert load(tmp_path / "f.json") == model
    plain = json.loads(cost().to_json())
    assert not {"network_jitter_s", "fleet_cpu_scale", "cores"} & set(plain)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("cores", 0, "cores"),
        ("cores", True, "cores"),
        ("cores", 1.5, "cores"),
        ("fleet_cpu_scale", 0, "fleet_cpu_scale"),
        ("fleet_cpu_scale", "x", "fleet_cpu_scale"),
        ("network_jitter_s", [0.1], "network_jitter_s"),
    ],
)
def test_bad_values_are_refused_by_name(key: str, value: object, message: str) -> None:
    body = json.loads(cost().to_json())
    body[key] = value
    with pytest.raises(ValueError, match=message):
        from_dict(body)


def test_the_fleet_terms_charge_only_a_fleet() -> None:
    """network_s, network_jitter_s and fleet_cpu_scale change a fleet's TTFT, never a lone
    server's."""
    trace = _warm_trace(tenants=3)
    fleet_terms = replace(cost(), network_s=0.02, network_jitter_s=SPREAD, fleet_cpu_scale=2.0)
    single = SimConfig()
    assert (
        simulate(trace, single, fleet_terms).to_json() == simulate(trace, single, cost()).to_json()
    )
    fleet = SimConfig(replicas=3)
    plain = simulate(trace, fleet, cost()).metrics["ttft_ms_warm"]
    scaled = simulate(trace, fleet, replace(cost(), fleet_cpu_scale=2.0)).metrics["ttft_ms_warm"]
    hopped = simulate(trace, fleet, fleet_terms).metrics["ttft_ms_warm"]
    assert scaled["p50"] > plain["p50"]
    assert hopped["p50"] > scaled["p50"] + 20  # 20 ms hop + 10 ms median spread
    assert hopped["p99"] - hopped["p50"] > 5  # the fleet's spread is drawn


def test_shared_cores_slow_a_burst_and_runs_repeat() -> None:
    trace = _burst()
    fleet = SimConfig(replicas=3)
    free = simulate(trace, fleet, cost()).metrics
    one = replace(cost(), cores=1)
    shared = simulate(trace, fleet, one)
    many = simulate(trace, fleet, replace(cost(), cores=64)).metrics
    assert shared.metrics["ttft_ms"]["p50"] > free["ttft_ms"]["p50"]
    assert many["ttft_ms"] == free["ttft_ms"]  # more cores than jobs: no contention
    assert simulate(trace, fleet, one).to_json() == shared.to_json()


def test_the_cpu_share_counts_steps_and_hops() -> None:
    share = CpuShare(2)
    share.steps = 1  # one replica in a step
    assert share.stretch(0.0) == 1.0  # one other step: two jobs on two cores
    share.add_hop(0.0, 0.01)
    share.add_hop(0.0, 0.03)
    assert share.jobs(0.005) == 3
    assert share.stretch(0.005) == 2.0  # four jobs on two cores
    assert share.jobs(0.02) == 2  # the first hop ended
    assert share.jobs(0.05) == 1
    with pytest.raises(ValueError, match="cores"):
        CpuShare(0)


def _samples(network_s: float, scale: float) -> list[FleetSample]:
    base = cost()
    out = []
    for length in (8, 32):
        for extra in (-0.002, 0.0, 0.003):
            sample = FleetSample(length, 8, 4096, 1.0)
            ttft = base.front_s + base.ipc_s + scale * sample.prefill_price_s(base)
            out.append(replace(sample, ttft_s=ttft + network_s + extra))
    decode = FleetSample(8, 8, 4096, 1.0, 1.0)
    out.append(replace(decode, tpot_s=scale * decode.decode_price_s(base)))
    return out


def test_the_fit_recovers_the_hop_and_the_scale() -> None:
    fit = fit_fleet(cost(), _samples(0.015, 1.4))
    assert fit.fleet_cpu_scale == pytest.approx(1.4)
    assert fit.network_s == pytest.approx(0.015)
    assert fit.network_jitter_s[0] == pytest.approx(-0.002)
    assert fit.network_jitter_s[-1] == pytest.approx(0.003)
    model = fleet_model(cost(), fit, 2, {"network_s": "measured"})
    assert (model.network_s, model.cores, model.sources["network_s"]) == (
        pytest.approx(0.015),
        2,
        "measured",
    )
    assert model.step == cost().step  # the lone server's line is kept


def test_a_negative_hop_is_floored_and_too_few_samples_refused() -> None:
    fit = fit_fleet(cost(), _samples(-0.001, 1.0))
    assert fit.network_s == 0.0
    assert fit.raw_network_s < 0
    with pytest.raises(ValueError, match="too few"):
        fit_fleet(cost(), [s for s in _samples(0.01, 1.0) if s.tpot_s is None])


def test_the_fleet_scale_slows_cold_loads_too() -> None:
    """A cold request pays its loads' stages: in a fleet scaled by 2 its TTFT grows by more
    than the scaled steps alone add (module docstring of ``cost_model``)."""
    trace = [TraceRecord(1.0 + i, "t", f"a{i}", 16, 4) for i in range(6)]  # every one cold
    fleet = SimConfig(replicas=3)
    plain = simulate(trace, fleet, cost()).metrics["ttft_ms"]["p50"]
    scaled = simulate(trace, fleet, replace(cost(), fleet_cpu_scale=2.0)).metrics["ttft_ms"]["p50"]
    assert scaled > 1.9 * (plain - 1000 * (cost().front_s + cost().ipc_s))


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--replicas", "1"], "replicas"),
        (["--requests", "1"], "requests"),
        (["--prefill-lengths", "0"], "prefill_lengths"),
    ],
)
def test_calibrate_fleet_refuses_bad_flags_by_name(
    tmp_path: Path, flags: list[str], named: str
) -> None:
    """Refused before any fleet starts (no Ray needed)."""
    from sim_inputs import COST_FILE
    from typer.testing import CliRunner

    from loraplex.cli import app

    args = ["sim", "calibrate-fleet", "--base", str(COST_FILE), "--out", str(tmp_path / "o.json")]
    result = CliRunner().invoke(app, [*args, *flags])
    assert result.exit_code != 0
    assert named in result.output
    assert not (tmp_path / "o.json").exists()


def test_calibrate_fleet_refuses_a_bad_base_file(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from loraplex.cli import app

    (tmp_path / "bad.json").write_text('{"schema": "other"}')
    args = ["sim", "calibrate-fleet", "--base", str(tmp_path / "bad.json")]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "o.json")])
    assert result.exit_code != 0
    assert "schema" in result.output
