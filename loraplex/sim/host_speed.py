"""The host's speed when a cost model was calibrated, and the same model on a slower or faster
host.

The calibrated step and hop prices hold the machine's speed at calibration time; on a shared
host that speed drifts (docs/simulator.md, "A host-speed reference"). ``HostProbe`` is a short,
fixed CPU workload timed beside the figures (``bench/sim/host_probe.py`` runs it; this side
never imports torch): a torch matmul and a Python loop, each the median of a few repeats.
Timed again right before a real run, ``probe_ratio(now, then)`` says how much slower the host
is, and ``host_scaled`` stretches the compute-bound prices by it.

Which prices scale was decided from two calibrations at different loads (docs/simulator.md):
``SCALED_STEP_TERMS`` and ``SCALED_HOPS`` by the ratio of the probes' sum (the matmul tracks
torch's work, the loop the Python around it; a step and a hop run both). Tier transfers
(I/O-bound copies and reads) and the fleet's measured shapes (``fleet_cpu_scale``, the
contention curve: ratios of a fleet over a lone server, which a host that slows whole keeps)
are not scaled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loraplex.sim.cost_model import CostModel

SCALED_STEP_TERMS = (
    "step_fixed_s",
    "per_token_s",
    "per_prefill_token_s",
    "per_revision_s",
    "per_rank_token_s",
    "per_byte_token_s",
    "per_revision_width_s",
    "per_prefill_step_s",
)
SCALED_HOPS = ("front_s", "ipc_s", "network_s")


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


def host_scaled(model: CostModel, ratio: float) -> CostModel:
    """``model`` with its compute-bound prices (module docstring) times ``ratio``, the hop's
    spread too; ``ratio`` 1 returns ``model`` itself."""
    if not (ratio > 0 and math.isfinite(ratio)):
        raise ValueError(f"host ratio {ratio!r} is invalid; expected finite and > 0")
    if ratio == 1.0:
        return model
    step = model.step
    terms = {n: getattr(step, n) for n in SCALED_STEP_TERMS if getattr(step, n) is not None}
    hops = {n: getattr(model, n) * ratio for n in SCALED_HOPS}
    return replace(
        model,
        step=replace(step, **{n: v * ratio for n, v in terms.items()}),
        hop_jitter_s=tuple(v * ratio for v in model.hop_jitter_s),
        network_jitter_s=tuple(v * ratio for v in model.network_jitter_s),
        **hops,
    )
