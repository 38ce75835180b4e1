"""Issue 30: a decode-mix request whose tokens reached the client together (a TPOT of the
client's parse time, 6-27 us a token, beside real steps of >= 1.18 ms) is no step time; it is
left out of its mix, with a warning, and a mix of nothing else yields no sample."""

import asyncio
import logging
from typing import Any

import pytest

from loraplex.bench.serve.driver import RequestRecord
from loraplex.bench.sim import calibrate_run
from loraplex.bench.sim.calibrate_run import CalibrateConfig, _mix_tpot
from loraplex.bench.sim.calibrate_target import ServedAdapter, Target


def _record(tpot_s: float | None) -> RequestRecord:
    return RequestRecord(0.0, "t", "a", "L0", 200, 0.01, tpot_s, 24, "r1", None)


def _mix(monkeypatch: pytest.MonkeyPatch, tpots: list[float | None], batch: int) -> float | None:
    replies = iter(tpots)

    async def fake_send_one(*args: Any, **kwargs: Any) -> RequestRecord:
        return _record(next(replies))

    monkeypatch.setattr(calibrate_run, "send_one", fake_send_one)
    adapter = ServedAdapter("t", "a", "r1", 8)
    target = Target("http://x", "k", (adapter,), {"t": "key"}, 100)
    return asyncio.run(_mix_tpot(target, batch, (adapter,), CalibrateConfig(), 0))


def test_a_burst_request_is_left_out_of_its_mix_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # the probe2 shape: one request's 24 tokens parsed back to back (8.1 us a token)
    with caplog.at_level(logging.WARNING, logger=calibrate_run.__name__):
        step = _mix(monkeypatch, [8.1e-6, 2.0e-3, 2.2e-3], batch=3)
    assert step == pytest.approx(2.1e-3)  # the median of the two real ones, not 2.0e-3
    assert "1 of 3 requests left out" in caplog.text
    assert "tokens arrived together" in caplog.text


def test_a_mix_of_bursts_only_yields_no_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    from loraplex.bench.sim.calibrate_run import BURST_TPOT_S

    # a one-request mix (simval-paced's batch-1 sample: 8.1 us) is no step sample at all
    assert _mix(monkeypatch, [8.1e-6], batch=1) is None
    # a real step just at the bound is kept; None (under 2 tokens) stays out as before
    assert _mix(monkeypatch, [BURST_TPOT_S, None], batch=2) == BURST_TPOT_S
