"""Cold loads beside running steps (``CostModel.load_busy_scale``): read, written, refused by
name, charged only to the stages before the copy of a load that starts while the engine has
requests running, and measured by the calibration (``bench/sim/calibrate_busy.py``)."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest
from sim_inputs import calibration_measured, cost

from loraplex.artifacts.identity import AdapterKey
from loraplex.bench.sim.calibrate_busy import BusySample, busy_scale
from loraplex.residency.ledger import Tier
from loraplex.residency.pipeline import CancelToken, Footprint, Move, Prepared
from loraplex.residency.stats import Stage
from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import from_dict, load
from loraplex.sim.pipeline import CostModelPipeline
from loraplex.sim.run import simulate
from loraplex.sim.trace import TraceRecord


def test_the_scale_round_trips_and_a_file_without_it_reads_as_one(tmp_path: Path) -> None:
    model = replace(cost(), load_busy_scale=2.5)
    model.save(tmp_path / "busy.json")
    assert load(tmp_path / "busy.json") == model
    assert json.loads(model.to_json())["load_busy_scale"] == 2.5
    assert cost().load_busy_scale == 1.0  # the example file has no such key
    assert "load_busy_scale" not in json.loads(cost().to_json())


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "load_busy_scale must be finite and > 0"),
        (-1.5, "load_busy_scale must be finite and > 0"),
        (float("inf"), "load_busy_scale must be finite and > 0"),
        ("slow", "load_busy_scale must be a number"),
        (True, "load_busy_scale must be a number"),
    ],
)
def test_a_bad_scale_is_refused_by_name(value: object, message: str) -> None:
    body = json.loads(cost().to_json())
    body["load_busy_scale"] = value
    with pytest.raises(ValueError, match=message):
        from_dict(body)


def _p99(trace: list[TraceRecord], scale: float, **config: object) -> float:
    model = replace(cost(), load_busy_scale=scale)
    return simulate(trace, SimConfig(**config), model).metrics["ttft_ms"]["p99"]  # type: ignore[arg-type]


def test_a_load_beside_running_steps_pays_the_scale_on_its_stages_before_the_copy() -> None:
    """b's load from the store starts while a decodes: scale 3 adds twice what scale 2 adds
    to b's TTFT (the slowest), and a more than nothing; a lone cold load pays its lone price."""
    beside = [TraceRecord(0.0, "t", "a", 16, 400), TraceRecord(0.5, "t", "b", 16, 4)]
    one, two, three = (_p99(beside, k) for k in (1.0, 2.0, 3.0))
    assert two > one + 5  # fetch and read of the example file: over 12 ms
    assert three - one == pytest.approx(2 * (two - one), abs=0.01)  # metrics: to the µs
    lone = [TraceRecord(0.0, "t", "b", 16, 4)]
    assert _p99(lone, 3.0) == _p99(lone, 1.0)


@pytest.mark.parametrize("busy", [True, False])
def test_the_pipeline_scales_fetch_and_read_not_the_copy_and_only_when_busy(busy: bool) -> None:
    """``CostModelPipeline``: with the engine busy, L3 -> L2 and L2 -> L1 cost the scale times
    their link's price and the copy into a slot its price; idle, every stage its price; what
    the engine's shared CPU is charged (``on_charge``) is the price either way."""
    model = replace(cost(), load_busy_scale=3.0)
    key = AdapterKey("a" * 64, "t", "a", "r1", "b" * 64)
    charged: list[float] = []
    pipe = CostModelPipeline(
        {key: Footprint(1000, 4000, 4000)}, model, charged.append, busy=lambda: busy
    )
    factor = 3.0 if busy else 1.0
    fetch = pipe.prepare(Move(key, Tier.L3, Tier.L2), CancelToken()).seconds[Stage.FETCH]
    read = pipe.prepare(Move(key, Tier.L2, Tier.L1), CancelToken()).seconds[Stage.READ]
    copy = pipe.install(Move(key, Tier.L1, Tier.L0), Prepared(None, {}), 0, CancelToken())
    prices = [model.links[name].seconds(4000) for name in ("L3_to_L2", "L2_to_L1", "L1_to_L0")]
    assert fetch == pytest.approx(factor * prices[0])
    assert read == pytest.approx(factor * prices[1])
    assert copy[Stage.COPY] == pytest.approx(prices[2])
    assert charged == pytest.approx(prices)


def test_the_scale_is_the_median_ratio_and_none_without_samples() -> None:
    samples = [BusySample("t/a@r1", 0.010, 0.030), BusySample("t/b@r1", 0.020, 0.020)]
    samples.append(BusySample("t/c@r1", 0.010, 0.025))
    assert busy_scale(samples) == pytest.approx(2.5)
    assert busy_scale([]) is None


def test_the_calibration_writes_the_scale_and_says_how_it_was_measured() -> None:
    from loraplex.bench.sim.calibrate_fit import cost_model_from
    from loraplex.bench.sim.calibrate_run import CalibrateConfig
    from loraplex.bench.sim.calibrate_target import Target
    from loraplex.sim.host_speed import HostProbe

    measured = calibration_measured()
    measured.update(cold=[], residuals=[])
    target = Target("http://x", "k", (), {}, 100)
    probes = [HostProbe(0.1, 0.1)]

    def fitted(busy: list[BusySample]) -> tuple[object, dict]:
        body = {**measured, "busy": busy}
        return cost_model_from(
            target, CalibrateConfig(), body, probes=probes, hardware="hw", command="cmd"
        )

    model, report = fitted([BusySample("t/a@r1", 0.010, 0.028), BusySample("t/b@r1", 0.01, 0.03)])
    assert model.load_busy_scale == pytest.approx(2.9)  # type: ignore[attr-defined]
    assert "ratios 2.80, 3.00" in model.sources["load_busy_scale"]  # type: ignore[attr-defined]
    assert "4 arriving" in model.sources["load_busy_scale"]  # type: ignore[attr-defined]
    assert [s["ratio"] for s in report["busy_samples"]] == pytest.approx([2.8, 3.0])
    model, _ = fitted([])
    assert model.load_busy_scale == 1.0  # type: ignore[attr-defined]
    assert model.sources["load_busy_scale"].startswith("not measured")  # type: ignore[attr-defined]


def test_interleaved_passes_merge_their_busy_samples() -> None:
    """``--calibrate-interleaved``: each pass measures its share of the samples; the model of
    several passes takes the median over all of them."""
    from loraplex.bench.sim.interleaved import merged

    passes = []
    for ratio in (2.0, 3.0, 4.0):
        one = calibration_measured()
        one.update(cold=[], residuals=[], busy=[BusySample("t/a@r1", 0.01, 0.01 * ratio)])
        passes.append(one)
    out = merged(passes)
    assert [s.ratio for s in out["busy"]] == pytest.approx([2.0, 3.0, 4.0])
    assert busy_scale(out["busy"]) == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"decoding": 0, "arrivals": 0}, "decoding 0, arrivals 0 is invalid"),
        ({"arrivals": -1}, "decoding 2, arrivals -1 is invalid"),
        ({"decode_tokens": 2}, "decode_tokens 2, arrival_tokens 4 is invalid"),
        ({"arrival_tokens": 1}, "decode_tokens 48, arrival_tokens 1 is invalid"),
        ({"arrival_gap_s": -0.001}, "head_start_s 0.05, arrival_gap_s -0.001 is invalid"),
        ({"head_start_s": -1.0}, "head_start_s -1.0, arrival_gap_s 0.004 is invalid"),
    ],
)
def test_a_bad_busy_mix_is_refused_by_name(fields: dict[str, float], message: str) -> None:
    from loraplex.bench.sim.calibrate_busy import BusyMix

    with pytest.raises(ValueError, match=message):
        BusyMix(**fields)  # type: ignore[arg-type]


def test_the_busy_load_runs_beside_decoding_requests_and_prefills_arriving_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second load of a sample (``TRACE_MIX``): the decoding requests sent first, then the
    cold one and, from its send on, the arrivals ``arrival_gap_s`` apart, all on the warm
    adapter but the cold one; the lone load runs with nothing beside it."""
    import asyncio

    from loraplex.bench.sim import calibrate_busy as busy
    from loraplex.bench.sim.calibrate_run import CalibrateConfig
    from loraplex.bench.sim.calibrate_target import ServedAdapter, Target

    cold, warm = ServedAdapter("t", "cold", "r1", 8), ServedAdapter("t", "warm", "r1", 8)
    target = Target("http://x", "k", (cold, warm), {"t": "key"}, 100)
    sent: list[tuple[float, str, str, int]] = []

    async def lone_ttft(target, adapter, config, length, rng, *, tier="L0", output_tokens=1):  # type: ignore[no-untyped-def]
        sent.append((asyncio.get_running_loop().time(), adapter.name, tier, output_tokens))
        await asyncio.sleep(0.01)
        return 0.01

    monkeypatch.setattr(busy, "lone_ttft", lone_ttft)
    mix = busy.BusyMix(head_start_s=0.02, arrival_gap_s=0.005)
    pair = busy._Pair(target, cold, warm, CalibrateConfig(), 8, mix)
    assert asyncio.run(busy._requests(pair, 0, busy=False)) == [0.01]
    assert [s[1:] for s in sent] == [("cold", "L3", 2)]
    sent.clear()
    ttfts = asyncio.run(busy._requests(pair, 0, busy=True))
    assert len(ttfts) == 1 + mix.decoding + mix.arrivals
    shapes = [s[1:] for s in sent]
    assert shapes == [("warm", "L0", 48)] * 2 + [("cold", "L3", 2)] + [("warm", "L0", 4)] * 4
    start = sent[2][0]
    assert start - sent[0][0] >= 0.02  # the decoding requests' head start
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(sent[2:])]
    assert gaps[0] < 0.005 and all(g >= 0.005 for g in gaps[1:])
    # before 2026-12-06 the mix was the decoding requests alone (``LIGHT_MIX``)
    assert busy.LIGHT_MIX.arrivals == 0 and busy.TRACE_MIX.arrivals == 4
