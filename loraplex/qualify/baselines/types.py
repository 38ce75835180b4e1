"""What ``loraplex qualify`` hands the comparators (separate deployments, in-context examples)
and what they answer: one cell's traffic in, one priced method out.

Shared by both sides of the comparison; the shapes are fixed by issue 29's split of work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from loraplex.qualify.cost import MachinePrice, TokenShape

CHECKS = ("correct_revision", "quality", "latency", "isolation")  # the four pass ratios


@dataclass(frozen=True)
class Probe:
    """One probe of an adapter revision: a prompt and the greedy text it must produce."""

    adapter_ref: str  # tenant/name@revision
    prompt: str  # probe prompt
    expected: str  # expected greedy continuation

    def __post_init__(self) -> None:
        if "@" not in self.adapter_ref:
            raise ValueError(f"Probe.adapter_ref {self.adapter_ref!r} must be tenant/name@revision")
        if not self.prompt:
            raise ValueError("Probe.prompt must not be empty")


@dataclass(frozen=True)
class BaselineContext:
    """Where a comparator finds the model and adapters and how it prices machines."""

    assets_dir: Path  # the demo assets (base model, adapters) the deployment serves
    preset: str  # demo preset name
    price: MachinePrice  # machine price per hour
    workdir: Path  # scratch space for the comparator's servers and files
    quick: bool  # the --quick run: smallest measurements that still mean something

    def __post_init__(self) -> None:
        if not self.preset:
            raise ValueError("BaselineContext.preset must not be empty")


@dataclass(frozen=True)
class CellTraffic:
    """One cell's traffic as loraplex served it, for a comparator to price."""

    cell_id: str  # the cell's id in the report
    shape: TokenShape  # prompt and output tokens per request
    requests: int  # requests sent in the cell
    wall_s: float  # wall time loraplex took for them
    demand_per_adapter_rps: dict[str, float]  # adapter ref -> requests per second
    ttft_slo_s: float  # the plan's TTFT objective (warm)
    tpot_slo_s: float  # the plan's TPOT objective
    probes: list[Probe] = field(default_factory=list)  # quality probes of the cell's revisions

    def __post_init__(self) -> None:
        if not self.cell_id:
            raise ValueError("CellTraffic.cell_id must not be empty")
        if self.requests < 0:
            raise ValueError(f"CellTraffic.requests must be >= 0, got {self.requests}")
        for name in ("wall_s", "ttft_slo_s", "tpot_slo_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"CellTraffic.{name} must be >= 0, got {getattr(self, name)}")
        bad = {ref: rps for ref, rps in self.demand_per_adapter_rps.items() if not rps >= 0}
        if bad:
            raise ValueError(f"CellTraffic.demand_per_adapter_rps must be >= 0, got {bad}")


@dataclass(frozen=True)
class MethodResult:
    """One method's result for one cell: the four pass ratios and the price of a correct one."""

    method: str  # "loraplex", "separate" or "in_context"
    pass_ratios: dict[str, float | None]  # CHECKS -> ratio; None where undefined
    cost_per_correct_request: float | None  # USD; None when no request passed
    machines: float  # machines the method needs for the cell's traffic
    wall_s: float  # wall time the cost is priced over
    terms: dict[str, object]  # every term of the price, for the report

    def __post_init__(self) -> None:
        if not self.method:
            raise ValueError("MethodResult.method must not be empty")
        unknown = set(self.pass_ratios) - set(CHECKS)
        if unknown:
            raise ValueError(f"MethodResult.pass_ratios has unknown checks {sorted(unknown)}")
        for check, ratio in self.pass_ratios.items():
            if ratio is not None and not 0.0 <= ratio <= 1.0:
                raise ValueError(f"MethodResult.pass_ratios[{check!r}] {ratio} not in [0, 1]")
        if self.machines < 0 or self.wall_s < 0:
            raise ValueError("MethodResult.machines and wall_s must be >= 0")
