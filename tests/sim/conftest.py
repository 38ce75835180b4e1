"""The calibration's host-speed probe (``bench/sim/host_probe.py``, about 2 s a call) stubbed
with fixed timings for every test here that calls ``calibration.calibrate`` on recorded
measurements (``test_host_probe.py`` times the real probe through its own module)."""

from __future__ import annotations

import pytest

from loraplex.sim.host_speed import HostProbe

FIXED = HostProbe(matmul_s=0.3, loop_s=0.2)


@pytest.fixture(autouse=True)
def _fixed_host_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    from loraplex.bench.sim import calibration

    monkeypatch.setattr(calibration, "host_probe", lambda: FIXED)
