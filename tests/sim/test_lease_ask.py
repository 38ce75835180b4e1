"""A miss's ask on the engine thread (``CostModel.lease_ask_s``): read, written, refused by
name; a file without it simulates as before; a cold request's load is asked for after it, and
the engine plans nothing meanwhile (a warm request leased after the miss in the same phase
waits too); no hit ratio moves by it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from sim_inputs import cost

from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import from_dict, load
from loraplex.sim.run import simulate
from loraplex.sim.trace import TraceRecord


def test_the_ask_round_trips_and_a_file_without_it_reads_as_zero(tmp_path: Path) -> None:
    model = replace(cost(), lease_ask_s=0.0007)
    model.save(tmp_path / "a.json")
    assert load(tmp_path / "a.json") == model
    assert "lease_ask_s" not in json.loads(cost().to_json())
    assert from_dict(json.loads(cost().to_json())).lease_ask_s == 0.0


@pytest.mark.parametrize(("value", "message"), [(-0.001, "lease_ask_s"), ("x", "lease_ask_s")])
def test_a_bad_ask_is_refused_by_name(value: object, message: str) -> None:
    body = json.loads(cost().to_json())
    body["lease_ask_s"] = value
    with pytest.raises(ValueError, match=message):
        from_dict(body)


def _metrics(trace: list[TraceRecord], ask_s: float, **config: object) -> dict:
    model = replace(cost(), lease_ask_s=ask_s, lease_handoff_s={"L1": 0.001, "L3": 0.002})
    return simulate(trace, SimConfig(**config), model).metrics  # type: ignore[arg-type]


def test_a_cold_request_pays_the_ask_before_its_load() -> None:
    """Two cold requests a second apart: each first token 0.5 s later with a 0.5 s ask."""
    trace = [TraceRecord(0.0, "t", "a", 16, 4), TraceRecord(1.0, "t", "b", 16, 4)]
    plain, asked = _metrics(trace, 0.0), _metrics(trace, 0.5)
    assert asked["hit_ratio"] == plain["hit_ratio"] and plain["hit_ratio"]["L3"] == 1.0
    for q in ("p50", "p99"):
        assert asked["ttft_ms"][q] == pytest.approx(plain["ttft_ms"][q] + 500, abs=1)


def test_the_ask_holds_the_engine_thread() -> None:
    """``a`` warm, then ``b`` (cold) and ``a`` arriving together: the warm request is leased
    after ``b``'s ask in the same request phase, so its first token waits for the ask too;
    the warm-up request alone pays the ask once, cold."""
    trace = [TraceRecord(0.0, "t", "a", 16, 4)]
    trace += [TraceRecord(1.0, "t", "b", 16, 4), TraceRecord(1.0, "t", "a", 16, 4)]
    plain, asked = _metrics(trace, 0.0), _metrics(trace, 0.2)
    assert asked["hit_ratio"] == plain["hit_ratio"] and plain["hit_ratio"]["L0"] == pytest.approx(
        1 / 3, abs=1e-3
    )
    assert asked["ttft_ms_warm"]["p50"] == pytest.approx(plain["ttft_ms_warm"]["p50"] + 200, abs=1)
    assert asked["ttft_ms_cold"]["p99"] == pytest.approx(plain["ttft_ms_cold"]["p99"] + 200, abs=1)
