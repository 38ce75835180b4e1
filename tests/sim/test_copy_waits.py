"""A copy into a GPU slot waits for the step in flight (``CostModel.copy_waits_for_step``):
read, written, refused by name, charged only to a copy that starts while its replica steps (the
real engine's slot lock, which every forward holds), the same whether steady decode steps are
simulated one by one or as a run, and written by the calibration with the copies it timed."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from sim_inputs import calibration_measured, cost

from loraplex.artifacts.identity import AdapterKey
from loraplex.bench.sim.calibrate_busy import BusySample, copy_medians
from loraplex.residency.ledger import Tier
from loraplex.residency.pipeline import CancelToken, Footprint, Move, Prepared
from loraplex.residency.stats import Stage
from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import from_dict, load
from loraplex.sim.outcome import Outcome
from loraplex.sim.pipeline import CostModelPipeline
from loraplex.sim.run import simulate
from loraplex.sim.trace import TraceRecord


def test_the_flag_round_trips_and_a_file_without_it_reads_as_false(tmp_path: Path) -> None:
    model = replace(cost(), copy_waits_for_step=True)
    model.save(tmp_path / "copy.json")
    assert load(tmp_path / "copy.json") == model
    assert json.loads(model.to_json())["copy_waits_for_step"] is True
    assert cost().copy_waits_for_step is False  # the example file has no such key
    assert "copy_waits_for_step" not in json.loads(cost().to_json())


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_flag_that_is_not_a_boolean_is_refused_by_name(value: object) -> None:
    body = json.loads(cost().to_json())
    body["copy_waits_for_step"] = value
    with pytest.raises(ValueError, match="copy_waits_for_step must be true or false"):
        from_dict(body)


@pytest.mark.parametrize("flag", [True, False])
def test_the_pipeline_adds_the_steps_rest_to_the_copy_only(flag: bool) -> None:
    """With the flag the copy costs its price plus what ``lock_wait`` says is left of the step
    in flight; fetch and read never; what the shared CPU is charged is the price either way."""
    model = replace(cost(), copy_waits_for_step=flag)
    key = AdapterKey("a" * 64, "t", "a", "r1", "b" * 64)
    charged: list[float] = []
    pipe = CostModelPipeline(
        {key: Footprint(1000, 4000, 4000)}, model, charged.append, lock_wait=lambda: 0.003
    )
    fetch = pipe.prepare(Move(key, Tier.L3, Tier.L2), CancelToken()).seconds[Stage.FETCH]
    read = pipe.prepare(Move(key, Tier.L2, Tier.L1), CancelToken()).seconds[Stage.READ]
    copy = pipe.install(Move(key, Tier.L1, Tier.L0), Prepared(None, {}), 0, CancelToken())
    prices = [model.links[name].seconds(4000) for name in ("L3_to_L2", "L2_to_L1", "L1_to_L0")]
    assert fetch == pytest.approx(prices[0])
    assert read == pytest.approx(prices[1])
    assert copy[Stage.COPY] == pytest.approx(prices[2] + (0.003 if flag else 0.0))
    assert charged == pytest.approx(prices)


def _ttfts(trace: list[TraceRecord], flag: bool, skip_steps: bool = True) -> dict[float, float]:
    """Each request's TTFT (s) by its arrival."""
    model = replace(cost(), copy_waits_for_step=flag)
    kept: list[Outcome] = []
    simulate(trace, SimConfig(), model, skip_steps=skip_steps, keep_outcomes=kept)
    return {o.t_s: o.first_token_s - o.t_s for o in kept if o.first_token_s is not None}


BESIDE = [TraceRecord(0.0, "t", "a", 16, 400), TraceRecord(0.5, "t", "b", 16, 4)]


def test_a_copy_that_starts_during_a_step_makes_its_request_miss_the_next_one() -> None:
    """b's load from the store reaches its copy while a decodes: the copy starts when a's step
    ends, the step planned then goes without b, and b's first token comes one of a's decode
    steps later (4.55 ms in the example file); a's own first token does not move."""
    before, after = _ttfts(BESIDE, False), _ttfts(BESIDE, True)
    step = cost().step
    step_s = step.step_fixed_s + step.per_token_s + step.per_revision_s  # a's decode step, about
    late = after[0.5] - before[0.5]
    assert step_s * 0.9 < late < 2 * step_s
    assert after[0.0] == before[0.0]


def test_a_lone_cold_load_pays_no_wait() -> None:
    lone = [TraceRecord(0.0, "t", "b", 16, 4)]
    assert _ttfts(lone, True) == _ttfts(lone, False)


def test_a_decode_run_waits_as_its_steps_one_by_one() -> None:
    """A copy that starts inside a steady decode run (``sim/decode_run.py``) waits for the step
    in flight there, exactly as when every step is its own event."""
    assert _ttfts(BESIDE, True, skip_steps=True) == _ttfts(BESIDE, True, skip_steps=False)


def test_the_calibration_writes_the_flag_with_the_copies_it_timed() -> None:
    from loraplex.bench.sim.calibrate_fit import cost_model_from
    from loraplex.bench.sim.calibrate_run import CalibrateConfig
    from loraplex.bench.sim.calibrate_target import Target
    from loraplex.sim.host_speed import HostProbe

    samples = [
        BusySample("t/a@r1", 0.010, 0.028, 0.0005, 0.0040),
        BusySample("t/b@r1", 0.010, 0.030, 0.0007, 0.0060),
        BusySample("t/c@r1", 0.010, 0.030),  # a report before the copies were kept
    ]
    assert copy_medians(samples) == pytest.approx((0.0006, 0.0050))
    assert copy_medians(samples[2:]) is None
    measured = {**calibration_measured(), "cold": [], "residuals": [], "busy": samples}
    target = Target("http://x", "k", (), {}, 100)
    model, report = cost_model_from(
        target, CalibrateConfig(), measured, probes=[HostProbe(0.1, 0.1)], hardware="hw",
        command="cmd",
    )  # fmt: skip
    assert model.copy_waits_for_step is True
    assert "5.00 ms beside steps against 0.60 ms alone" in model.sources["copy_waits_for_step"]
    assert report["busy_samples"][0]["copy_busy_s"] == 0.004
    measured["busy"] = []
    model, _ = cost_model_from(
        target, CalibrateConfig(), measured, probes=[HostProbe(0.1, 0.1)], hardware="hw",
        command="cmd",
    )  # fmt: skip
    assert model.copy_waits_for_step is True
    assert "no copy was timed beside steps" in model.sources["copy_waits_for_step"]
