"""The one place calibration, validation, ``bench sim`` and the planner call the simulator core:
``simulate(trace, config, cost_model)`` (``sim/run.py``), ``SimConfig`` (``sim/config.py``),
``parse_record`` / ``read_trace`` (``sim/trace.py``) and ``scale_run`` (``sim/scale.py``).

NOTE: the core is built in parallel with this side (issue 30, two branches). It is reached by
module path here, at call time, so this side builds and its own tests pass without it; when it
is missing a call fails with ``SimulatorMissing`` naming what is absent, never with a made-up
result. Once both are on one branch these lookups can become plain imports (one file to edit).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from loraplex.sim.cost_model import CostModel

_CORE = {
    "simulate": "loraplex.sim.run",
    "SimConfig": "loraplex.sim.config",
    "parse_record": "loraplex.sim.trace",
    "read_trace": "loraplex.sim.trace",
    "scale_run": "loraplex.sim.scale",
}


class SimulatorMissing(RuntimeError):
    """The simulator core (``simulate`` and its kin) is not in this tree."""


def core(name: str) -> Any:
    """One entry point of the simulator core, by name (``_CORE``)."""
    module_name = _CORE[name]
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise SimulatorMissing(
            f"{module_name}.{name} is not in this tree: the simulator core (issue 30) provides it"
        ) from exc


def available() -> bool:
    try:
        for name in _CORE:
            core(name)
    except SimulatorMissing:
        return False
    return True


def records(rows: Iterable[Mapping[str, Any]]) -> list[Any]:
    """Trace rows (``t_s, tenant, adapter, prompt_tokens, output_tokens``, optional ``rank``,
    ``size_bytes``) as the simulator's records, sorted by arrival."""
    parse = core("parse_record")
    parsed = [parse(row, f"trace[{i}]") for i, row in enumerate(rows)]
    return sorted(parsed, key=lambda r: r.t_s)


def read_trace(path: Path) -> list[Any]:
    return list(core("read_trace")(path))


def simulate_metrics(
    trace: list[Any], config: Mapping[str, Any], cost_model: CostModel
) -> dict[str, Any]:
    """The result metrics of one simulation (``sim/result.py``) of ``trace`` under the
    ``SimConfig`` fields in ``config`` (unknown or invalid fields: the config's ValueError)."""
    sim_config = core("SimConfig")(**config)
    result = core("simulate")(trace, sim_config, cost_model)
    metrics: dict[str, Any] = dict(result.metrics)
    return metrics


def scale_metrics(
    requests: int, adapters: int, replicas: int, cost_model: CostModel
) -> dict[str, Any]:
    """The core's timed scale run (its wall seconds and peak RSS among the keys)."""
    out: dict[str, Any] = dict(core("scale_run")(requests, adapters, replicas, cost_model))
    return out
