"""The qualification plan: which cells to run, how much traffic each gets, the objectives each
answer is judged against and the machine price (docs/qualification.md, "The plan").

A plan file (TOML or JSON) has the tables below; every key is optional (the defaults are the
dataclass defaults), and an unknown table or key is refused by its dotted name.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from loraplex.qualify.cost import TOKEN_SHAPES, MachinePrice

ACTIVE_ADAPTERS = (1, 16, 256, 1024)
RANK_DISTRIBUTIONS = ("all-8", "mixed", "heavy-tail")
POPULARITIES = ("uniform", "zipf-0.8", "zipf-1.2", "hot-burst")
DESIGNS = ("factorial", "covering")
METHODS = ("separate", "in_context")
# The default price: this machine class, a 2-vCPU x86 VM (AWS m5.large on demand, us-east-1).
DEFAULT_PRICE = MachinePrice("cpu-2vcpu", 0.096, "AWS EC2 m5.large on-demand, us-east-1, Linux")


class PlanError(ValueError):
    """A plan file that cannot be used: unreadable, an unknown key, a value out of range."""


@dataclass(frozen=True)
class MatrixPlan:
    """The axes and how cells are formed from them."""

    design: str = "factorial"  # factorial: every combination; covering: each level once at least
    active_adapters: tuple[int, ...] = ACTIVE_ADAPTERS  # adapters traffic is drawn from
    rank_distributions: tuple[str, ...] = RANK_DISTRIBUTIONS  # RANK_DISTRIBUTIONS names
    token_shapes: tuple[str, ...] = tuple(TOKEN_SHAPES)  # cost.TOKEN_SHAPES names
    popularities: tuple[str, ...] = POPULARITIES  # POPULARITIES names

    def __post_init__(self) -> None:
        _one_of("matrix.design", self.design, DESIGNS)
        _levels("matrix.rank_distributions", self.rank_distributions, RANK_DISTRIBUTIONS)
        _levels("matrix.token_shapes", self.token_shapes, tuple(TOKEN_SHAPES))
        _levels("matrix.popularities", self.popularities, POPULARITIES)
        if not self.active_adapters or any(not 1 <= n <= 4096 for n in self.active_adapters):
            raise PlanError(
                f"matrix.active_adapters {list(self.active_adapters)} is invalid; expected a "
                "non-empty list of counts from 1 to 4096"
            )


@dataclass(frozen=True)
class TrafficPlan:
    """How much each cell sends and which answers are checked against offline references."""

    requests_per_cell: int = 12  # traffic requests per cell
    concurrency: int = 4  # requests in flight at once
    reference_sample: int = 2  # traffic requests per cell whose text is checked offline
    seed: int = 0  # adapters, prompts and popularity draws
    deployment_adapters: tuple[str, ...] = ()  # tenant/name aliases already deployed, also sent
    request_timeout_s: float = 120.0  # one request, start to last token (its retries included)
    max_retries: int = 2  # re-sends of a request refused 429/503 with Retry-After, after its wait

    def __post_init__(self) -> None:
        _at_least("traffic.requests_per_cell", self.requests_per_cell, 1)
        _at_least("traffic.concurrency", self.concurrency, 1)
        _at_least("traffic.reference_sample", self.reference_sample, 0)
        _at_least("traffic.seed", self.seed, 0)
        _at_least("traffic.max_retries", self.max_retries, 0)
        if self.reference_sample > self.requests_per_cell:
            raise PlanError("traffic.reference_sample must be <= traffic.requests_per_cell")
        for alias in self.deployment_adapters:
            tenant, _, name = alias.partition("/")
            if not tenant or not name or "@" in alias:
                raise PlanError(
                    f"traffic.deployment_adapters entry {alias!r} is invalid; expected tenant/name"
                )
        if not self.request_timeout_s > 0:
            raise PlanError("traffic.request_timeout_s must be > 0")


@dataclass(frozen=True)
class ObjectivePlan:
    """The latency and quality objectives an answer must meet, and what a cell must reach."""

    ttft_warm_s: float = 3.0  # TTFT objective when the adapter was in a GPU slot (L0)
    ttft_cold_s: float = 10.0  # TTFT objective when it had to be loaded (L1, L2, L3)
    tpot_s: float = 0.5  # time per output token after the first
    min_latency_ratio: float = 0.9  # share of a cell's answers that must meet their objective
    min_quality_ratio: float = 1.0  # share of a cell's probes that must pass

    def __post_init__(self) -> None:
        for name in ("ttft_warm_s", "ttft_cold_s", "tpot_s"):
            if not getattr(self, name) > 0:
                raise PlanError(f"objectives.{name} {getattr(self, name)} is invalid; expected > 0")
        for name in ("min_latency_ratio", "min_quality_ratio"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise PlanError(f"objectives.{name} {getattr(self, name)} must be in [0, 1]")


@dataclass(frozen=True)
class IsolationPlan:
    """The hostile tenant beside every cell and the foreign effect a victim may see."""

    hostile_adapters: int = 8  # the hostile tenant's own adapters (eviction pressure, cold storm)
    hostile_requests_per_cell: int = 8  # its cold-load storm requests per cell
    max_victim_failures: int = 0  # victim requests refused or failed (429/5xx) a cell tolerates

    def __post_init__(self) -> None:
        _at_least("isolation.hostile_adapters", self.hostile_adapters, 1)
        _at_least("isolation.hostile_requests_per_cell", self.hostile_requests_per_cell, 0)
        _at_least("isolation.max_victim_failures", self.max_victim_failures, 0)


@dataclass(frozen=True)
class QualifyPlan:
    """One qualification run."""

    matrix: MatrixPlan = field(default_factory=MatrixPlan)
    traffic: TrafficPlan = field(default_factory=TrafficPlan)
    objectives: ObjectivePlan = field(default_factory=ObjectivePlan)
    isolation: IsolationPlan = field(default_factory=IsolationPlan)
    price: MachinePrice = DEFAULT_PRICE  # per machine-hour
    machines: float = 1.0  # machines the deployment under test runs on (replicas' hosts)
    compare: tuple[str, ...] = METHODS  # comparators run per cell

    def __post_init__(self) -> None:
        if not self.machines > 0:
            raise PlanError(f"machines {self.machines} is invalid; expected > 0")
        _levels("compare", self.compare, METHODS, allow_empty=True)


def quick(plan: QualifyPlan) -> QualifyPlan:
    """``--quick``: a covering design over 1 and 16 active adapters, small cells."""
    matrix = replace(plan.matrix, design="covering", active_adapters=(1, 16))
    traffic = replace(plan.traffic, requests_per_cell=min(plan.traffic.requests_per_cell, 8))
    isolation = replace(plan.isolation, hostile_adapters=4, hostile_requests_per_cell=4)
    return replace(plan, matrix=matrix, traffic=traffic, isolation=isolation)


def load_plan(path: Path | None) -> QualifyPlan:
    """The plan in ``path`` (``.toml`` or ``.json``); the defaults when None."""
    if path is None:
        return QualifyPlan()
    try:
        text = path.read_text(encoding="utf-8")
        raw = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as exc:
        raise PlanError(f"plan {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise PlanError(f"plan {path}: expected a table at the top")
    return plan_from_dict(raw)


_TABLES: dict[str, type] = {
    "matrix": MatrixPlan,
    "traffic": TrafficPlan,
    "objectives": ObjectivePlan,
    "isolation": IsolationPlan,
    "price": MachinePrice,
}


def plan_from_dict(raw: dict[str, Any]) -> QualifyPlan:
    """A plan from parsed TOML/JSON; PlanError naming the first unknown or bad key."""
    _known("", raw, {f.name for f in fields(QualifyPlan)})
    values: dict[str, Any] = {}
    for name, value in raw.items():
        if name in _TABLES:
            values[name] = _table(name, value, _TABLES[name])
        elif name == "compare":
            values[name] = _tuple(name, value)
        else:
            values[name] = value
    try:
        return QualifyPlan(**values)
    except (TypeError, ValueError) as exc:
        raise PlanError(str(exc)) from None


def _table(name: str, value: Any, cls: type) -> Any:
    if not isinstance(value, dict):
        raise PlanError(f"plan key {name!r} must be a table")
    _known(f"{name}.", value, {f.name for f in fields(cls)})
    items = {k: _tuple(f"{name}.{k}", v) if isinstance(v, list) else v for k, v in value.items()}
    try:
        return cls(**items)
    except TypeError as exc:
        raise PlanError(f"plan table {name!r}: {exc}") from None
    except ValueError as exc:
        raise PlanError(f"plan table {name!r}: {exc}") from None


def _known(prefix: str, table: dict[str, Any], names: set[str]) -> None:
    unknown = sorted(set(table) - names)
    if unknown:
        raise PlanError(
            f"plan key {prefix}{unknown[0]!r} is unknown; expected one of {sorted(names)}"
        )


def _tuple(name: str, value: Any) -> tuple[Any, ...]:
    if not isinstance(value, list):
        raise PlanError(f"plan key {name!r} must be a list")
    return tuple(value)


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise PlanError(f"{name} {value!r} is invalid; expected one of {list(allowed)}")


def _levels(
    name: str, values: tuple[str, ...], allowed: tuple[str, ...], allow_empty: bool = False
) -> None:
    if not values and not allow_empty:
        raise PlanError(f"{name} must not be empty")
    for value in values:
        _one_of(name, value, allowed)
    if len(set(values)) != len(values):
        raise PlanError(f"{name} {list(values)} repeats a level")


def _at_least(name: str, value: int, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise PlanError(f"{name} {value!r} is invalid; expected an integer >= {low}")
