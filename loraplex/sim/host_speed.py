"""The host's speed when a cost model was calibrated, and at a later run.

The calibrated step and hop prices hold the machine's speed at calibration time; on a shared
host that speed drifts (docs/simulator.md, "A host-speed reference"). ``HostProbe`` is a short,
fixed CPU workload timed beside the figures (``bench/sim/host_probe.py`` runs it; this side
never imports torch): a torch matmul on one thread and a Python loop, each the median of a few
repeats. ``bench sim`` times it again right before each real run and reports
``probe_ratio(now, calibration)`` per trace.

NOTE: the ratio is reported, never applied to the prices. Five calibrations at different loads
(2026-12-05, SIMFLEET3) showed the probe does not track the step figures (its ratio 1.2-5.3
while the decode samples' moved 0.5-0.7 and the prefill steps' 0.9-1.2) and tracks the hop
only loosely, so scaling the prices by it would be a guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class HostProbe:
    """One timing of the fixed probe (``bench/sim/host_probe.py``)."""

    matmul_s: float  # median seconds of the fixed torch matmul loop (one thread)
    loop_s: float  # median seconds of the fixed Python loop

    def __post_init__(self) -> None:
        for name in ("matmul_s", "loop_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"host_probe.{name} must be a number, got {value!r}")
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"host_probe.{name} must be finite and > 0, got {value!r}")

    @property
    def total_s(self) -> float:
        return self.matmul_s + self.loop_s


def probe_ratio(now: HostProbe, then: HostProbe) -> float:
    """How many times slower the host is ``now`` than ``then`` (the probes' summed seconds)."""
    return now.total_s / then.total_s
