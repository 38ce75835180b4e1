"""``bench/sim/calibrate_timeline.py``: the calibration's lone prefill requests on the engine's own
timeline (a server's request log), and a calibration fitted on them (the fit itself:
tests/sim/test_prefill_step.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loraplex.bench.sim.calibrate_target import ServedAdapter
from loraplex.bench.sim.calibrate_timeline import (
    first_step_s,
    log_lines,
    log_size,
    prefill_timings,
    timed_samples,
    wait_for_lines,
)

LOW = ServedAdapter("calibration", "r8", "v1", 8, size_bytes=8 * 4096)
HIGH = ServedAdapter("calibration", "r64", "v1", 64, size_bytes=64 * 4096)


def _line(served: ServedAdapter, prompt: int, step_s: float, **over: object) -> dict:  # type: ignore[type-arg]
    engine = {"scheduled_s": 0.0004, "first_step_end_s": 0.0004 + step_s}
    line = {
        "tenant": served.tenant,
        "adapter": f"{served.name}@{served.revision}",
        "prompt_tokens": prompt,
        "output_tokens": 8,
        "tier": "L0",
        "ttft_s": 0.011,
        "engine": engine,
    }
    line.update(over)
    return line


def test_first_steps_are_read_per_adapter_and_prompt_and_only_of_the_lone_shape() -> None:
    lines = [_line(LOW, 16, s) for s in (0.0068, 0.0070, 0.0090)]
    lines += [_line(LOW, 64, 0.0108), _line(HIGH, 16, 0.0075)]
    lines += [
        _line(LOW, 16, 0.5, tier="L1"),  # its lease waited for a load: not a warm step
        _line(LOW, 16, 0.5, output_tokens=24),  # a decode mix's request
        _line(LOW, 16, 0.5, engine=None),  # no timeline
        _line(LOW, 16, 0.5, engine={"scheduled_s": 0.001, "first_step_end_s": None}),
        _line(LOW, 16, 0.5, adapter="r8@v2"),  # another revision
        _line(LOW, 16, 0.5, tenant="other"),
    ]
    groups = [(LOW, 16), (LOW, 64), (HIGH, 16), (HIGH, 64)]
    timings = prefill_timings(lines, groups, output_tokens=8)
    assert [(t.adapter, t.prompt_tokens) for t in timings] == groups[:3]  # HIGH/64: none logged
    assert timings[0].steps_s == pytest.approx((0.0068, 0.0070, 0.0090))
    assert timings[0].median_s == pytest.approx(0.0070)
    assert first_step_s({"engine": {"scheduled_s": 0.002, "first_step_end_s": 0.001}}) is None
    samples = timed_samples(timings, {LOW: (8 * 4096, 4096.0), HIGH: (64 * 4096, 4096.0)})
    first = samples[0]
    assert (first.decode_tokens, first.prefill_tokens, first.revisions) == (0, 16, 1)
    assert (first.rank_tokens, first.byte_tokens, first.revision_widths) == (
        128,
        16 * 32768,
        4096.0,
    )
    assert first.step_s == pytest.approx(0.0070) and not first.hop and first.timed_prefill


def test_the_log_is_read_from_where_the_prefill_samples_began(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    assert log_size(log) == 0 and log_size(None) == 0
    log.write_text(json.dumps(_line(LOW, 16, 0.5, output_tokens=1)) + "\n")  # earlier traffic
    start = log_size(log)
    with log.open("a") as f:
        for step_s in (0.006, 0.007):
            f.write(json.dumps(_line(LOW, 16, step_s)) + "\n")
    assert len(log_lines(log)) == 3
    lines = wait_for_lines(log, start, expected=2, output_tokens=8)
    assert [first_step_s(x) for x in lines] == pytest.approx([0.006, 0.007])
    # fewer than expected: returned after the wait, as they are
    assert len(wait_for_lines(log, start, expected=2, output_tokens=1)) == 2
