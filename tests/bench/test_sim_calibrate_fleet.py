"""``sim calibrate-fleet``'s measuring loop (``bench/sim/calibrate_fleet._measure``) against a
stand-in ingress: warms each adapter until it is served from a GPU slot, keeps only warm
successful requests, counts the rest as left out. No Ray, no server."""

from __future__ import annotations

from typing import Any

import pytest

from loraplex.bench.serve.driver import DriveConfig, RequestRecord
from loraplex.bench.sim import calibrate_fleet
from loraplex.bench.sim.calibrate_fleet import FleetCalibrateConfig, _measure
from loraplex.bench.workloads import ATTENTION_TARGETS, TraceAdapter, TraceRequest

ADAPTERS = [TraceAdapter("t", "r8", 8, ATTENTION_TARGETS), TraceAdapter("t", "r64", 64, ())]
SIZES = {("t", "r8"): 1000, ("t", "r64"): 8000}


def _fake_ingress(monkeypatch: pytest.MonkeyPatch, cold_first: int, fail_every: int = 0) -> list:
    """Each adapter's first ``cold_first`` requests are served cold (tier L3); every
    ``fail_every``-th request after that fails (0: none)."""
    sent: list[TraceRequest] = []

    async def send_one(url: str, request: TraceRequest, **_: Any) -> RequestRecord:
        sent.append(request)
        mine = sum(1 for r in sent if r.adapter == request.adapter)
        tier = "L3" if mine <= cold_first else "L0"
        failed = fail_every and tier == "L0" and mine % fail_every == 0
        tokens = request.output_tokens
        return RequestRecord(
            0.0, request.tenant, request.adapter, tier, 503 if failed else 200,
            0.04 + 0.001 * request.prompt_tokens, 0.01 if tokens > 1 else None, tokens,
            "r1", "busy" if failed else None,
        )  # fmt: skip

    monkeypatch.setattr(calibrate_fleet, "send_one", send_one)
    return sent


def test_warms_then_keeps_only_warm_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    sent = _fake_ingress(monkeypatch, cold_first=2)
    config = FleetCalibrateConfig(requests=3, prefill_lengths=(8, 32))
    drive = DriveConfig(request_timeout_s=5.0, vocab_size=100)
    samples, left_out = _measure(
        "http://x", "key", ADAPTERS, sizes=SIZES, config=config, drive=drive
    )
    assert left_out == 0
    assert len(sent) == 2 * (3 + 2 * 3 + 3)  # 3 warming (2 cold, 1 warm) + prefills + decodes
    prefills = [s for s in samples if s.tpot_s is None]
    decodes = [s for s in samples if s.tpot_s is not None]
    assert len(prefills) == 2 * 2 * 3 and len(decodes) == 2 * 3
    assert {(s.rank, s.nbytes) for s in samples} == {(8, 1000), (64, 8000)}
    assert {s.prompt_tokens for s in prefills} == {8, 32}
    assert all(r.output_tokens == 24 for r in sent[-3:])  # the decode requests


def test_failed_and_cold_requests_are_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_ingress(monkeypatch, cold_first=7, fail_every=5)  # not warm within the 6 tries
    config = FleetCalibrateConfig(requests=2, prefill_lengths=(8,))
    drive = DriveConfig(request_timeout_s=5.0, vocab_size=100)
    samples, left_out = _measure(
        "http://x", "key", ADAPTERS[:1], sizes=SIZES, config=config, drive=drive
    )
    # 6 warming tries (cold), then prefills 7 (cold) and 8, decodes 9 and 10 (failed)
    assert left_out == 2
    assert [(s.prompt_tokens, s.tpot_s is None) for s in samples] == [(8, True), (8, False)]


def test_config_refuses_what_is_not_a_fleet() -> None:
    with pytest.raises(ValueError, match="replicas"):
        FleetCalibrateConfig(replicas=1)
    with pytest.raises(ValueError, match="output_tokens"):
        FleetCalibrateConfig(output_tokens=2)
