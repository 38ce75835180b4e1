"""What ``loraplex qualify`` hands the comparators and what they hand back (torch-free).

One cell of the qualification matrix is described by its traffic (``CellTraffic``); each
comparator measures what it must on a real server, prices the deployment that traffic would
need, and returns a ``MethodResult`` in the same terms as loraplex's own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from loraplex.qualify.cost import MachinePrice, TokenShape

if TYPE_CHECKING:
    from loraplex.qualify.baselines.server import ServerPool

# The four checks every answer is judged on (issue 29), the keys of MethodResult.pass_ratios.
CHECKS = ("correct_revision", "quality", "latency", "isolation")


@dataclass(frozen=True)
class Probe:
    """One quality probe: the greedy continuation of ``prompt`` must start with ``expected``."""

    adapter_ref: str  # tenant/name@revision the probe judges
    prompt: str  # the probe's prompt text
    expected: str  # the continuation that passes (prefix match, as release probes judge)

    def __post_init__(self) -> None:
        if "/" not in self.adapter_ref or "@" not in self.adapter_ref:
            raise ValueError(
                f"Probe.adapter_ref {self.adapter_ref!r} is invalid; expected tenant/name@revision"
            )
        if not self.prompt:
            raise ValueError("Probe.prompt must not be empty")
        if not self.expected:
            raise ValueError("Probe.expected must not be empty")


@dataclass(frozen=True)
class BaselineContext:
    """What every comparator of one qualification run shares."""

    assets_dir: Path  # a generated demo set (its manifest.json, base model and adapters)
    preset: str  # the preset that set was generated with (checked against its manifest)
    price: MachinePrice  # what a machine-hour costs
    workdir: Path  # servers' data, merged models and the run's measurement cache
    quick: bool  # fewer, shorter measurements (the CI run)
    # Servers kept across cells (the in-context base model); None: each cell starts its own.
    servers: ServerPool | None = None

    def __post_init__(self) -> None:
        if not self.preset:
            raise ValueError("BaselineContext.preset must not be empty")
        if not self.assets_dir.is_dir():
            raise ValueError(
                f"BaselineContext.assets_dir {str(self.assets_dir)!r} is invalid; "
                "expected a generated demo asset directory"
            )


@dataclass(frozen=True)
class CellTraffic:
    """The traffic of one matrix cell, as the comparators must serve it."""

    cell_id: str  # the cell's name in the report
    shape: TokenShape  # prompt and output tokens per request
    requests: int  # requests the cell sends
    wall_s: float  # how long the cell's traffic lasts
    demand_per_adapter_rps: dict[str, float]  # adapter ref -> mean requests per second
    ttft_slo_s: float  # time-to-first-token objective
    tpot_slo_s: float  # time-per-output-token objective
    probes: list[Probe]  # quality probes of the cell's adapters
    # adapter ref -> its PEFT directory on this machine, for adapters outside the demo set
    # (qualification's generated ones): a separate deployment can merge and judge them too
    adapter_dirs: dict[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.cell_id:
            raise ValueError("CellTraffic.cell_id must not be empty")
        if self.requests < 1:
            raise ValueError(f"CellTraffic.requests must be >= 1, got {self.requests}")
        for name in ("wall_s", "ttft_slo_s", "tpot_slo_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"CellTraffic.{name} must be finite and > 0, got {value!r}")
        if not self.demand_per_adapter_rps:
            raise ValueError("CellTraffic.demand_per_adapter_rps must name at least one adapter")
        for ref, rps in self.demand_per_adapter_rps.items():
            if not (math.isfinite(rps) and rps >= 0):
                raise ValueError(
                    f"CellTraffic.demand_per_adapter_rps[{ref!r}] must be finite and >= 0, "
                    f"got {rps!r}"
                )


@dataclass(frozen=True)
class MethodResult:
    """One method's outcome on one cell, priced like loraplex's own."""

    method: str  # "loraplex", "separate" or "in_context"
    pass_ratios: dict[str, float | None]  # CHECKS -> ratio; None: undefined (nothing judged)
    cost_per_correct_request: float | None  # USD; None when no request passed
    machines: float  # machines the deployment needs for the cell's traffic
    wall_s: float  # hours priced = wall_s / 3600
    terms: dict[str, object]  # every term of the price and how it was measured

    def __post_init__(self) -> None:
        if not self.method:
            raise ValueError("MethodResult.method must not be empty")
        if set(self.pass_ratios) != set(CHECKS):
            raise ValueError(
                f"MethodResult.pass_ratios keys {sorted(self.pass_ratios)} are invalid; "
                f"expected {list(CHECKS)}"
            )
        for name, ratio in self.pass_ratios.items():
            if ratio is not None and not 0.0 <= ratio <= 1.0:
                raise ValueError(f"MethodResult.pass_ratios[{name!r}] {ratio} is not in [0, 1]")
        if self.machines < 0:
            raise ValueError(f"MethodResult.machines must be >= 0, got {self.machines}")
        if self.wall_s < 0:
            raise ValueError(f"MethodResult.wall_s must be >= 0, got {self.wall_s}")
