"""Issue 30 (docs/simulator.md, "CALFAULT"): a decode mix's TPOT is timed on the engine's clock
(the request log's timelines) where the log is at hand, so a request whose tokens the client
read together after a stall, wholly (6-27 us a token) or in part (140-694 us beside real steps
of >= 1.18 ms), no longer moves its sample; without a log the client's clock stays with
``BURST_TPOT_S``'s rule. Either way the report keeps every run's TPOTs on both clocks and what
was left out."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from sim_inputs import calibration_measured

from loraplex.bench.serve.driver import RequestRecord
from loraplex.bench.sim import calibrate_decode, calibration
from loraplex.bench.sim.calibrate_decode import (
    BURST_TPOT_S,
    CLIENT_CLOCK,
    ENGINE_CLOCK,
    MixRecord,
    MixRun,
    mix_record,
    mix_run,
)
from loraplex.bench.sim.calibrate_run import CalibrateConfig
from loraplex.bench.sim.calibrate_target import ServedAdapter, Target
from loraplex.bench.sim.calibrate_timeline import decode_tpot_s, decode_tpots

ADAPTER = ServedAdapter("t", "a", "r1", 8)
CONFIG = CalibrateConfig()


def _line(tpot_s: float, *, outcome: str = "length", prompt: int = 8, tokens: int = 24) -> dict:
    """A request-log line of a decode-mix request whose steps took ``tpot_s`` on the engine."""
    first = 0.004
    engine = {"first_step_end_s": first, "end_s": round(first + tpot_s * (tokens - 1), 6)}
    return {
        "adapter": "a@r1",
        "outcome": outcome,
        "prompt_tokens": prompt,
        "output_tokens": tokens,
        "tier": "L0",
        "engine": engine,
    }


def _run(
    monkeypatch: pytest.MonkeyPatch,
    client_tpots: list[float | None],
    engine_tpots: list[float] | None,
    tmp_path: Path,
) -> MixRun:
    """One run of a mix of ``len(client_tpots)`` requests: the client saw ``client_tpots``; the
    server's request log (None: no log, as against ``--url``) gets a line per ``engine_tpots``
    as each request ends."""
    log = None if engine_tpots is None else tmp_path / "requests.jsonl"
    if log is not None:
        log.write_text(json.dumps({"adapter": "earlier", "output_tokens": 24}) + "\n")
    replies = iter(client_tpots)
    lines = iter(engine_tpots or [])

    async def fake_send_one(*args: Any, **kwargs: Any) -> RequestRecord:
        if log is not None:
            with log.open("a", encoding="utf-8") as f:
                f.write(json.dumps(_line(next(lines))) + "\n")
        return RequestRecord(0.0, "t", "a", "L0", 200, 0.01, next(replies), 24, "r1", None)

    monkeypatch.setattr(calibrate_decode, "send_one", fake_send_one)
    target = Target("http://x", "k", (ADAPTER,), {"t": "key"}, 100, request_log=log)
    return mix_run(target, len(client_tpots), (ADAPTER,), CONFIG, 0)


def test_a_run_with_the_request_log_is_timed_on_the_engines_clock(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # one request read whole after a stall (8.1 us), one in part (0.5 ms), one on time
    run = _run(monkeypatch, [8.1e-6, 0.5e-3, 2.2e-3], [2.0e-3, 2.1e-3, 2.2e-3], tmp_path)
    assert run.clock == ENGINE_CLOCK
    assert run.tpot_s == pytest.approx(2.1e-3)  # the client's median was 0.5 ms
    assert run.engine_tpots_s == pytest.approx((2.0e-3, 2.1e-3, 2.2e-3))
    assert run.client_tpots_s == (8.1e-6, 0.5e-3, 2.2e-3)  # kept beside, for the report
    assert run.bursts_s == (8.1e-6,)


def test_without_the_request_log_a_burst_is_left_out_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    with caplog.at_level(logging.WARNING, logger=calibrate_decode.__name__):
        run = _run(monkeypatch, [8.1e-6, 2.0e-3, 2.2e-3], None, tmp_path)
    assert run.clock == CLIENT_CLOCK and run.engine_tpots_s == ()
    assert run.tpot_s == pytest.approx(2.1e-3)  # the median of the two real ones
    assert run.bursts_s == (8.1e-6,)
    assert "1 of 3 requests left out" in caplog.text
    # a one-request mix of a burst gives nothing; a step just at the bound is kept
    assert _run(monkeypatch, [8.1e-6], None, tmp_path).tpot_s is None
    assert _run(monkeypatch, [BURST_TPOT_S, None], None, tmp_path).tpot_s == BURST_TPOT_S


def test_the_engines_tpot_of_a_logged_line() -> None:
    assert decode_tpot_s(_line(2.0e-3)) == pytest.approx(2.0e-3)
    assert decode_tpot_s({**_line(2.0e-3), "engine": None}) is None
    assert decode_tpot_s(_line(2.0e-3, tokens=1)) is None
    lines = [_line(1e-3), _line(2e-3, outcome="abort"), _line(3e-3, prompt=16), _line(4e-3)]
    lines.append(_line(5e-3, tokens=8))  # a lone prefill request's shape
    assert decode_tpots(lines, 8, 24) == pytest.approx([1e-3, 4e-3])


def test_the_report_keeps_what_each_run_measured_and_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    left = MixRun(7, CLIENT_CLOCK, (), (8.1e-6, 2.0e-3, 2.2e-3), (8.1e-6,), 2.1e-3)
    engine = MixRun(8, ENGINE_CLOCK, (2.0e-3,), (6e-6,), (6e-6,), 2.0e-3)
    nothing = MixRun(9, CLIENT_CLOCK, (), (9e-6,), (9e-6,), None)
    mixes = [
        MixRecord(3, ("t/a@r1",), (left, engine), 2.05e-3),
        MixRecord(1, ("t/a@r1",), (nothing,), None),
    ]
    measured = {**calibration_measured(), "cold": [], "residuals": [], "decode_mixes": mixes}
    monkeypatch.setattr(calibration, "measure", lambda target, config: measured)
    target = Target("http://x", "k", (), {}, 100)
    model, written = calibration.calibrate(target, CONFIG, "hw", "cmd")
    report = json.loads(json.dumps(written))  # as the --report file holds it
    runs = report["decode_mixes"][0]["runs"]
    assert runs[0]["bursts_s"] == [8.1e-6] and runs[0]["clock"] == "client"
    assert report["decode_mixes"][1]["step_s"] is None  # a mix without a sample is kept too
    clock = report["decode_clock"]
    assert clock["burst_tpot_s"] == BURST_TPOT_S and "burst_tpot_s" in clock["rule"]
    assert (clock["client_bursts"], clock["left_out"], clock["mixes_without_sample"]) == (3, 2, 1)
    assert clock["clocks"] == ["client", "engine"]
    assert "1 of 3 runs on the engine's clock" in model.sources["step"]
    assert "2 runs on the client's clock, 2 requests under 100 us" in model.sources["step"]


def test_a_remeasured_calibration_keeps_the_first_measurements_mixes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dataclasses import replace

    first = MixRecord(1, ("t/a@r1",), (MixRun(1, CLIENT_CLOCK, (), (8e-6,), (8e-6,), None),), None)
    again = MixRecord(1, ("t/a@r1",), (MixRun(2, ENGINE_CLOCK, (2e-3,), (2e-3,), (), 2e-3),), 2e-3)
    clean = {**calibration_measured(), "cold": [], "residuals": []}
    steps = list(clean["steps"])
    steps[5] = replace(steps[5], step_s=8e-6)  # the broken TPOT of the kept files
    broken = {**clean, "steps": steps, "step_fit": calibration.fit_step(steps)}
    monkeypatch.setattr(calibration, "measure", lambda t, c: {**broken, "decode_mixes": [first]})
    monkeypatch.setattr(
        calibration, "remeasure_steps", lambda t, c, m: {**clean, "decode_mixes": [again]}
    )
    _, written = calibration.calibrate(Target("http://x", "k", (), {}, 100), CONFIG, "hw", "cmd")
    report = json.loads(json.dumps(written))
    assert report["decode_mixes"][0]["runs"][0]["seed"] == 2
    assert report["fit_check"]["first_decode_mixes"][0]["runs"][0]["bursts_s"] == [8e-6]
    # read back (scripts/sim-timeline/robust_passes.py refits from reports)
    assert mix_record(report["decode_mixes"][0]) == again
