"""A waiting lease's hand-off (``CostModel.lease_handoff_s``): read, written, refused, charged
to the waiting request only (the copy is resident when its load completes), and measured from
the engine's timelines of a calibration's lone requests."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from sim_inputs import calibration_measured, cost

from loraplex.bench.sim.calibrate_cold import lease_handoffs
from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import Link, from_dict, load
from loraplex.sim.run import simulate
from loraplex.sim.trace import TraceRecord


def test_the_hand_offs_round_trip_and_old_files_read_as_before(tmp_path: Path) -> None:
    model = replace(cost(), lease_handoff_s={"L1": 0.0017, "L3": 0.0069})
    model.save(tmp_path / "h.json")
    assert load(tmp_path / "h.json") == model
    assert "lease_handoff_s" not in json.loads(cost().to_json())


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"L0": 0.001}, "unknown keys"),
        ({"L1": -0.001}, "lease_handoff_s.L1"),
        ({"L1": "slow"}, "must be a number"),
        (0.001, "tier -> seconds"),
    ],
)
def test_bad_hand_offs_are_refused_by_name(value: object, message: str) -> None:
    body = json.loads(cost().to_json())
    body["lease_handoff_s"] = value
    with pytest.raises(ValueError, match=message):
        from_dict(body)


def _ttfts(
    trace: list[TraceRecord],
    handoff: dict[str, float],
    links: dict[str, Link] | None = None,
    **config: object,
) -> dict:
    model = replace(cost(), lease_handoff_s=handoff)
    if links is not None:
        model = replace(model, links=links)
    return simulate(trace, SimConfig(**config), model).metrics  # type: ignore[arg-type]


def test_a_waiting_request_pays_its_tiers_hand_off_and_nothing_else_moves() -> None:
    """a (cold), b (cold, takes a's only slot), a again (from CPU memory): an L1 hand-off of
    0.5 s delays the third request's first token by 0.5 s and changes no hit ratio, when its copy
    (here 50 ms) does not fit the step's copy wait (``MAX_COPY_WAIT_S``); one that fits is
    settled in the step that waited for it, with no hand-off."""
    trace = [TraceRecord(t, "t", name, 16, 4) for t, name in ((0.0, "a"), (1.0, "b"), (2.0, "a"))]
    links = {**cost().links, "L1_to_L0": Link(0.050, 1e15)}
    plain = _ttfts(trace, {}, links, max_loras=1)
    slow = _ttfts(trace, {"L1": 0.5}, links, max_loras=1)
    assert slow["hit_ratio"] == plain["hit_ratio"] and plain["hit_ratio"]["L1"] > 0
    assert slow["ttft_ms"]["p99"] == pytest.approx(plain["ttft_ms"]["p99"] + 500, abs=25)
    assert slow["ttft_ms"]["p50"] == plain["ttft_ms"]["p50"]  # the two cold loads from L3
    assert _ttfts(trace, {"L2": 0.5}, links, max_loras=1) == plain  # no load came from L2
    fits = _ttfts(trace, {}, max_loras=1)
    assert _ttfts(trace, {"L1": 0.5}, max_loras=1) == fits


def test_the_copy_is_resident_when_its_load_completes() -> None:
    """A request for the same adapter arriving during the first one's hand-off finds it in a
    slot and is served at its warm TTFT, before the first."""
    trace = [TraceRecord(0.0, "t", "a", 16, 4), TraceRecord(0.3, "t", "a", 16, 4)]
    plain = _ttfts(trace, {})
    slow = _ttfts(trace, {"L3": 1.0})
    assert slow["hit_ratio"] == plain["hit_ratio"] and slow["hit_ratio"]["L0"] == 0.5
    assert slow["ttft_ms_warm"] == plain["ttft_ms_warm"]
    assert slow["ttft_ms_cold"]["p50"] == pytest.approx(plain["ttft_ms_cold"]["p50"] + 1000, abs=5)


def _line(
    tier: str,
    scheduled_s: float,
    load_s: float = 0.0,
    *,
    waited: bool = False,
    asked_s: float = 0.0,
) -> dict:
    engine = {"scheduled_s": scheduled_s, "load_s": load_s, "ready_s": 0.001 if waited else None}
    engine["asked_s"] = asked_s
    return {"tier": tier, "output_tokens": 1, "engine": engine}


def test_hand_offs_are_measured_on_the_engines_timelines() -> None:
    lines = [_line("L0", s) for s in (0.0004, 0.0005, 0.0006)]
    lines += [_line("L1", 0.003, 0.001, waited=True), _line("L1", 0.004, 0.001, waited=True)]
    lines += [_line("L3", 0.020, 0.012, waited=True)]
    lines += [{**_line("L1", 0.5, waited=True), "output_tokens": 24}]  # a mix: not lone
    lines += [{"tier": "L1", "output_tokens": 1, "engine": None}]  # no timeline
    found = lease_handoffs(lines)
    assert found is not None
    assert found.seconds == pytest.approx({"L1": 0.002, "L3": 0.0075})  # less 0.5 ms at once
    assert found.counts == {"L1": 2, "L3": 1} and found.at_once == 3
    assert found.ask_s == 0.0  # every request asked at once here
    assert lease_handoffs(lines[:3]) is None  # nothing waited
    assert lease_handoffs(lines[3:6]) is None  # nothing leased at once


def test_the_ask_on_a_miss_is_measured_apart_from_the_hand_off() -> None:
    """The waiting leases' median ask beyond the at-once ones' is ``lease_ask_s``, and the
    hand-off is counted from the ask's end: together they span what the hand-off alone did."""
    lines = [_line("L0", s, asked_s=0.0002) for s in (0.0004, 0.0005, 0.0006)]
    lines += [_line("L1", 0.003, 0.001, waited=True, asked_s=0.0009)]
    lines += [_line("L1", 0.004, 0.001, waited=True, asked_s=0.0009)]
    lines += [_line("L3", 0.020, 0.012, waited=True, asked_s=0.0011)]
    found = lease_handoffs(lines)
    assert found is not None
    assert found.ask_s == pytest.approx(0.0009 - 0.0002)  # the median ask: 0.9 ms
    assert found.at_once_ask_s == pytest.approx(0.0002)
    assert found.at_once_plan_s == pytest.approx(0.0003)  # the plan after the ask
    assert found.seconds == pytest.approx({"L1": 0.0016 - 0.0003, "L3": 0.0069 - 0.0003})
    before = 0.0025 - 0.0005  # the hand-off measured from the engine's receipt, as before
    assert found.seconds["L1"] + found.ask_s == pytest.approx(before)


def test_a_calibration_with_timelines_charges_the_hand_off_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Measured on timelines, the hand-offs go to ``lease_handoff_s`` (L2 from L1) and the
    TTFT-based ones stay off the links (the same wait); without timelines, as before."""
    from loraplex.bench.sim import calibration
    from loraplex.bench.sim.calibrate_cold import ColdSample, LeaseHandoffs
    from loraplex.bench.sim.calibrate_run import CalibrateConfig
    from loraplex.bench.sim.calibrate_target import Target

    cold = [ColdSample("a", 0.030, 0.010, 0.010, "L3"), ColdSample("a", 0.014, 0.010, 0.001, "L1")]
    found = LeaseHandoffs({"L1": 0.0017, "L3": 0.0069}, {"L1": 12, "L3": 12}, 0.0005, 40, 0.0007)
    measured = calibration_measured()
    measured.update(cold=cold, residuals=[], handoffs=found)
    monkeypatch.setattr(calibration, "measure", lambda target, config: dict(measured))
    target = Target("http://x", "k", (), {}, 100)
    model, report = calibration.calibrate(target, CalibrateConfig(), "hw", "cmd")
    assert model.lease_handoff_s == {"L1": 0.0017, "L2": 0.0017, "L3": 0.0069}
    assert "L2 not measured" in model.sources["lease_handoff_s"]
    assert model.lease_ask_s == 0.0007 and "24 lone requests" in model.sources["lease_ask_s"]
    assert report["lease_handoffs"]["counts"] == {"L1": 12, "L3": 12}
    measured["handoffs"] = None
    ttft_based, _ = calibration.calibrate(target, CalibrateConfig(), "hw", "cmd")
    assert ttft_based.lease_handoff_s == {} and ttft_based.lease_ask_s == 0.0
    assert "not measured" in ttft_based.sources["lease_handoff_s"]
    for link, added in (("L1_to_L0", 0.003), ("L3_to_L2", 0.010 - 0.003)):  # TTFT-based
        extra = ttft_based.links[link].fixed_s - model.links[link].fixed_s
        assert extra == pytest.approx(added)
