"""``scripts/sim-timeline/tail_stages.py``: a paired row's stages (real and simulated, ms) and
the slowest fraction by a TTFT (simtail2, docs/simulator.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "sim-timeline"


def _row(ttft: float, sim: float) -> dict[str, object]:
    engine = {"asked_s": 0.001, "ready_s": 0.031, "lease_s": 0.032, "load_s": 0.025,
              "room_wait_s": 0.0, "scheduled_s": 0.033, "first_step_end_s": 0.040}  # fmt: skip
    sim_engine = {"hop_s": 0.009, "lease_s": 0.020, "scheduled_s": 0.020, "first_step_end_s": 0.027}
    return {"real_ttft_ms": ttft, "sim_ttft_ms": sim, "engine": engine, "sim_engine": sim_engine}


def test_stages_split_a_row_into_the_engines_stages() -> None:
    sys.path.insert(0, str(SCRIPTS))
    from tail_stages import stages

    s = stages(_row(50.0, 36.0))
    assert s["r_outside"] == pytest.approx(10.0)  # client TTFT less the first step's end
    assert s["r_ask_ready"] == pytest.approx(30.0)
    assert s["r_queue"] == pytest.approx(5.0)  # ask -> ready less the stage seconds
    assert s["r_first_step"] == pytest.approx(7.0)
    assert s["s_outside"] == pytest.approx(9.0) and s["s_lease"] == pytest.approx(20.0)
    assert s["s_first_step"] == pytest.approx(7.0) and s["s_lease_plan"] == pytest.approx(0.0)


def test_slowest_keeps_the_top_fraction_rounded_up() -> None:
    sys.path.insert(0, str(SCRIPTS))
    from tail_stages import medians, slowest

    rows = [_row(float(t), 20.0) for t in range(1, 41)]
    top = slowest(rows, "real_ttft_ms", 0.05)
    assert [r["real_ttft_ms"] for r in top] == [40.0, 39.0]
    assert medians(top)["n"] == 2 and medians(top)["r_ttft"] == pytest.approx(39.5)


def test_band_keeps_the_rows_between_two_quantiles() -> None:
    sys.path.insert(0, str(SCRIPTS))
    from tail_stages import band

    rows = [_row(float(t), 50.0 - t) for t in range(1, 42)]  # 41 rows, real 1..41
    middle = band(rows, "real_ttft_ms", 0.4, 0.6)
    assert [r["real_ttft_ms"] for r in middle] == [float(t) for t in range(17, 26)]
    sim = band(rows, "sim_ttft_ms", 0.5, 0.5)  # the median row alone, by the simulated TTFT
    assert [r["sim_ttft_ms"] for r in sim] == [29.0]
    assert band([], "real_ttft_ms", 0.4, 0.6) == []
