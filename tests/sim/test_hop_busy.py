"""A lone server's busy hop (``CostModel.hop_busy_s``, simp50-p50): read, written and refused by
name; charged to a request that arrives while another is in flight on the server (in its engine
or still on its way in), never to one that arrives alone nor in a fleet; ``sim calibrate``
measures it on its server's request log (``calibrate_cold.hop_samples``,
``calibrate.fit_hop_busy``) and writes it with its source."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sim_inputs import calibration_measured, cost

from loraplex.bench.sim.calibrate_cold import hop_samples
from loraplex.bench.sim.calibrate_fit import cost_model_from
from loraplex.bench.sim.calibrate_run import CalibrateConfig
from loraplex.bench.sim.calibrate_target import Target
from loraplex.bench.sim.interleaved import merged
from loraplex.sim.calibrate import HopSample, fit_hop_busy
from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import from_dict, load
from loraplex.sim.host_speed import HostProbe
from loraplex.sim.outcome import Outcome
from loraplex.sim.run import simulate
from loraplex.sim.trace import TraceRecord

BUSY_S = 0.05  # far above a step's price in the example file (about 4 ms)


def _ttfts(hop_busy_s: float, trace: list[TraceRecord], replicas: int = 1) -> list[float]:
    kept: list[Outcome] = []
    model = replace(cost(), hop_busy_s=hop_busy_s)
    simulate(trace, SimConfig(replicas=replicas), model, keep_outcomes=kept)
    return [o.first_token_s - o.t_s for o in sorted(kept, key=lambda o: o.t_s) if o.first_token_s]


def test_the_key_round_trips_and_a_file_without_it_reads_as_zero(tmp_path: Path) -> None:
    model = replace(cost(), hop_busy_s=0.007)
    model.save(tmp_path / "busy.json")
    assert load(tmp_path / "busy.json") == model
    assert json.loads(model.to_json())["hop_busy_s"] == 0.007
    assert cost().hop_busy_s == 0.0 and "hop_busy_s" not in json.loads(cost().to_json())


@pytest.mark.parametrize("value", [-0.001, "1", True, float("inf")])
def test_a_bad_value_is_refused_by_name(value: object) -> None:
    body = json.loads(cost().to_json())
    body["hop_busy_s"] = value
    with pytest.raises(ValueError, match="hop_busy_s"):
        from_dict(body)


def test_requests_that_arrive_alone_pay_nothing() -> None:
    lone = [TraceRecord(0.0, "t", "a", 16, 4), TraceRecord(5.0, "t", "a", 16, 4)]
    assert _ttfts(BUSY_S, lone) == _ttfts(0.0, lone)


def test_a_request_arriving_beside_a_decoding_one_pays_it() -> None:
    """The first request (64 tokens, decoding at 0.1 s) arrives alone and pays nothing; the
    second, arriving mid-decode, reaches its engine ``hop_busy_s`` later: its TTFT grows by that
    much, give or take the wait for the step in flight (less than one step here)."""
    trace = [TraceRecord(0.0, "t", "a", 16, 64), TraceRecord(0.1, "t", "a", 16, 4)]
    before, after = _ttfts(0.0, trace), _ttfts(BUSY_S, trace)
    assert after[0] == before[0]
    assert after[1] - before[1] == pytest.approx(BUSY_S, abs=0.01)


def test_a_request_arriving_during_the_others_hop_pays_it() -> None:
    """The second request (the adapter warm from an earlier one) arrives while the first is
    still on its way in (the hop 1.5 ms); the first arrived alone."""
    trace = [
        TraceRecord(0.0, "t", "a", 16, 4),
        TraceRecord(1.0, "t", "a", 16, 4),
        TraceRecord(1.0005, "t", "a", 16, 4),
    ]
    before, after = _ttfts(0.0, trace), _ttfts(BUSY_S, trace)
    assert after[:2] == before[:2]
    assert after[2] - before[2] == pytest.approx(BUSY_S, abs=0.01)


def test_a_fleet_is_not_charged() -> None:
    trace = [TraceRecord(0.01 * i, "t", "a", 16, 16) for i in range(12)]
    assert _ttfts(BUSY_S, trace, replicas=3) == _ttfts(0.0, trace, replicas=3)


def _line(t_s: float, latency_s: float, ttft_s: float | None, fse: float | None) -> dict:
    engine = None if fse is None else {"first_step_end_s": fse, "scheduled_s": 0.001}
    return {"t_s": t_s, "latency_s": latency_s, "ttft_s": ttft_s, "engine": engine}


def test_hop_samples_mark_the_requests_that_arrived_while_another_was_in_flight() -> None:
    lines = [
        _line(0.0, 0.050, 0.020, 0.015),  # the log's first: left out (first_hop_s)
        _line(0.010, 0.030, 0.025, 0.012),  # arrives while the first runs: busy, 13 ms outside
        _line(1.0, 0.030, 0.010, 0.006),  # alone: 4 ms outside
        _line(1.020, 0.030, None, None),  # busy, but no first token: no sample
        _line(2.0, 0.030, 0.012, 0.007),  # alone (the one before ended at 1.05): 5 ms
    ]
    samples = hop_samples(list(reversed(lines)))  # the log's order is not relied on
    assert [s.busy for s in samples] == [True, False, False]
    assert [s.outside_s for s in samples] == pytest.approx([0.013, 0.004, 0.005])


def test_the_fit_is_the_busy_median_less_the_lone_median_floored_at_zero() -> None:
    samples = [HopSample(x, True) for x in (0.010, 0.012, 0.020)]
    samples += [HopSample(x, False) for x in (0.003, 0.004, 0.009)]
    fit = fit_hop_busy(samples)
    assert fit.seconds == pytest.approx(0.008)
    assert (fit.busy, fit.lone) == (3, 3)
    assert fit_hop_busy([HopSample(0.001, True), HopSample(0.004, False)]).seconds == 0.0
    none = fit_hop_busy([HopSample(0.004, False)])
    assert none.seconds == 0.0 and none.busy_median_s is None


def _model(hops: list[HopSample] | None) -> Any:
    measured = {**calibration_measured(), "cold": [], "residuals": []}
    if hops is not None:
        measured["hop_busy"] = hops
    return cost_model_from(
        Target("http://x", "k", (), {}, 100), CalibrateConfig(), measured,
        probes=[HostProbe(0.1, 0.1)], hardware="hw", command="cmd",
    )  # fmt: skip


def test_the_calibration_writes_the_measured_seconds_and_their_source() -> None:
    passes = [
        {**calibration_measured(), "cold": [], "residuals": [], "hop_busy": hops}
        for hops in (
            [HopSample(0.010, True), HopSample(0.003, False)],
            [HopSample(0.012, True), HopSample(0.004, False), HopSample(0.005, False)],
        )
    ]
    hops = merged(passes)["hop_busy"]  # each server's samples kept together
    model, report = _model(hops)
    assert model.hop_busy_s == pytest.approx(0.011 - 0.004)
    assert "arrived while another was in flight" in model.sources["hop_busy_s"]
    assert report["hop_busy"]["busy"] == 2 and report["hop_busy"]["lone"] == 3
    unmeasured, _ = _model(None)  # no request log (``--url`` without one, older callers)
    assert unmeasured.hop_busy_s == 0.0 and "not measured" in unmeasured.sources["hop_busy_s"]
