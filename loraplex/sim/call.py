"""The one place calibration, validation, ``bench sim`` and the planner call the simulator core:
``simulate(trace, config, cost_model)`` (``sim/run.py``), ``SimConfig`` (``sim/config.py``),
``parse_record`` / ``read_trace`` (``sim/trace.py``) and ``scale_run`` (``sim/scale.py``), with
plain dictionaries in and out, so the measuring side does not depend on the core's types.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from loraplex.sim import trace as sim_trace
from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import CostModel
from loraplex.sim.run import simulate
from loraplex.sim.scale import scale_run


def records(rows: Iterable[Mapping[str, Any]]) -> list[Any]:
    """Trace rows (``t_s, tenant, adapter, prompt_tokens, output_tokens``, optional ``rank``,
    ``size_bytes``) as the simulator's records, sorted by arrival."""
    parsed = [sim_trace.parse_record(row, f"trace[{i}]") for i, row in enumerate(rows)]
    return sorted(parsed, key=lambda r: r.t_s)


def read_trace(path: Path) -> list[Any]:
    return list(sim_trace.read_trace(path))


def simulate_metrics(
    trace: list[Any],
    config: Mapping[str, Any],
    cost_model: CostModel,
    replica_ids: Sequence[str] | None = None,
    adapter_keys: Mapping[tuple[str, str], Any] | None = None,
) -> dict[str, Any]:
    """The result metrics of one simulation (``sim/result.py``) of ``trace`` under the
    ``SimConfig`` fields in ``config`` (unknown or invalid fields: the config's ValueError),
    its replicas named ``replica_ids`` and its adapters keyed by ``adapter_keys``
    (``simulate``'s; None: the simulator's own names)."""
    result = simulate(
        trace, SimConfig(**config), cost_model, replica_ids=replica_ids, adapter_keys=adapter_keys
    )
    metrics: dict[str, Any] = dict(result.metrics)
    return metrics


def scale_metrics(
    requests: int, adapters: int, replicas: int, cost_model: CostModel
) -> dict[str, Any]:
    """The core's timed scale run (its wall seconds and peak RSS among the keys)."""
    out: dict[str, Any] = dict(scale_run(requests, adapters, replicas, cost_model))
    return out
