"""From what was measured to a ``MethodResult``: each comparator's pass ratios, machines and cost
per correct request, with every term of the price in ``terms`` (pure, no I/O, torch-free)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from loraplex.qualify.baselines.pricing import (
    LoadLevel,
    Machines,
    OperatingPoint,
    cold_share,
    correct_requests,
    latency_with_cold_starts,
    machines_for,
    operating_point,
    replicas_needed,
    saturated,
)
from loraplex.qualify.baselines.types import CellTraffic, MethodResult, Probe
from loraplex.qualify.cost import MachinePrice, cost_per_correct_request

SEPARATE_DEPLOYMENT = (
    "one dense model per adapter (PEFT merge_and_unload), loraplex serve with it as the base "
    "model and no adapter"
)
BY_CONSTRUCTION = "1.0 by construction: each deployment serves one adapter and nothing else"


@dataclass(frozen=True)
class Footprint:
    """One replica as measured: its load sweep at the cell's shape and its memory."""

    levels: Sequence[LoadLevel]  # closed-loop levels at the cell's token shape
    peak_rss_bytes: int  # one replica's peak resident memory (server and engine processes)
    machine_memory_bytes: int  # memory of the machine it was measured on


def level_terms(levels: Sequence[LoadLevel], ttft_slo_s: float, tpot_slo_s: float) -> list[object]:
    """The sweep as the report shows it."""
    return [
        {
            "concurrency": level.concurrency,
            "requests": len(level.samples),
            "completed": sum(s.ok for s in level.samples),
            "completed_rps": level.completed_rps,
            "latency_pass_ratio": level.latency_pass_ratio(ttft_slo_s, tpot_slo_s),
        }
        for level in levels
    ]


def _sweep_terms(
    footprint: Footprint, point: OperatingPoint, cell: CellTraffic
) -> dict[str, object]:
    """The replica as measured and the operating point chosen from its sweep."""
    return {
        "levels": level_terms(footprint.levels, cell.ttft_slo_s, cell.tpot_slo_s),
        "operating_concurrency": point.concurrency,
        "capacity_rps": point.capacity_rps,
        "sweep_saturated": saturated(footprint.levels),
        "warm_latency_pass_ratio": point.latency_pass_ratio,
        "replica_peak_rss_bytes": footprint.peak_rss_bytes,
        "machine_memory_bytes": footprint.machine_memory_bytes,
    }


def quality_ratio(judged: Mapping[Probe, bool | None]) -> tuple[float | None, int, int]:
    """(probes passed / probes judged, judged, not judged); None when none was judged."""
    known = [v for v in judged.values() if v is not None]
    ratio = sum(known) / len(known) if known else None
    return ratio, len(known), len(judged) - len(known)


def _price_terms(
    price: MachinePrice, cell: CellTraffic, machines: Machines, correct: int | None
) -> dict[str, object]:
    return {
        "price_name": price.name,
        "price_usd_per_hour": price.usd_per_hour,
        "price_source": price.source,
        "wall_s": cell.wall_s,
        "requests": cell.requests,
        "correct_requests": correct,
        "machines_by_compute": machines.by_compute,
        "machines_by_memory": machines.by_memory,
        "machines": machines.machines,
    }


def _cost(
    price: MachinePrice, cell: CellTraffic, machines: int, correct: int | None
) -> float | None:
    return cost_per_correct_request(price, machines, cell.wall_s, correct or 0)


def _deployment(
    demand: Mapping[str, float], footprint: Footprint, capacity_rps: float, scale_to_zero: bool
) -> tuple[dict[str, int] | None, Machines]:
    """Replicas per deployment and the machines they take; (None, no machines) when the
    replica completed nothing at any level (no number of replicas serves the traffic)."""
    if capacity_rps <= 0:
        return None, Machines(0.0, 0.0, 0)
    replicas = replicas_needed(demand, capacity_rps, scale_to_zero=scale_to_zero)
    machines = machines_for(
        demand,
        replicas,
        capacity_rps,
        footprint.peak_rss_bytes,
        footprint.machine_memory_bytes,
    )
    return replicas, machines


def price_separate(
    price: MachinePrice,
    cell: CellTraffic,
    footprint: Footprint,
    cold_start_s: float,
    judged: Mapping[Probe, bool | None],
    *,
    scale_to_zero: bool,
) -> MethodResult:
    """One merged deployment per adapter of the cell, each sized at the replica's best
    operating point; cold starts count against the TTFT objective under scale-to-zero."""
    point = operating_point(footprint.levels, cell.ttft_slo_s, cell.tpot_slo_s)
    demand = cell.demand_per_adapter_rps
    replicas, machines = _deployment(demand, footprint, point.capacity_rps, scale_to_zero)
    share = cold_share(demand, cell.wall_s, scale_to_zero=scale_to_zero)
    latency = latency_with_cold_starts(
        point.latency_pass_ratio, share, cold_start_s, cell.ttft_slo_s
    )
    quality, num_judged, not_judged = quality_ratio(judged)
    correct = correct_requests(cell.requests, [1.0, quality, latency, 1.0])
    terms: dict[str, object] = {
        "deployment": SEPARATE_DEPLOYMENT,
        "correct_revision": BY_CONSTRUCTION,
        "isolation": BY_CONSTRUCTION,
        "quality_probes_judged": num_judged,
        "quality_probes_not_judged": not_judged,
        **_sweep_terms(footprint, point, cell),
        "cold_start_s": cold_start_s,
        "scale_to_zero": scale_to_zero,
        "cold_share": share,
        "deployments": len(demand),
        "replicas": None if replicas is None else sum(replicas.values()),
        "deployments_at_zero": None if replicas is None else list(replicas.values()).count(0),
        **_price_terms(price, cell, machines, correct),
    }
    return MethodResult(
        "separate",
        {"correct_revision": 1.0, "quality": quality, "latency": latency, "isolation": 1.0},
        _cost(price, cell, machines.machines, correct),
        float(machines.machines),
        cell.wall_s,
        terms,
    )


def price_in_context(
    price: MachinePrice,
    cell: CellTraffic,
    footprint: Footprint,
    judged: Mapping[Probe, bool | None],
    terms: dict[str, object],
) -> MethodResult:
    """The base model serving every adapter's traffic with examples in the prompt, sized at
    its best operating point at the longer prompts; ``terms``: what the caller measured."""
    point = operating_point(footprint.levels, cell.ttft_slo_s, cell.tpot_slo_s)
    demand = {"base": sum(cell.demand_per_adapter_rps.values())}
    replicas, machines = _deployment(demand, footprint, point.capacity_rps, False)
    quality, num_judged, not_judged = quality_ratio(judged)
    latency = point.latency_pass_ratio
    correct = correct_requests(cell.requests, [quality, latency])
    all_terms: dict[str, object] = {
        "deployment": "the base model (no adapter), k examples of the adapter's behaviour "
        "in every prompt",
        "correct_revision": "null: no adapter revision answers (quality judges whether the "
        "examples steer the base model to the revision's behaviour)",
        "isolation": "null: not measured (no hostile tenant ran beside the comparator)",
        "quality_probes_judged": num_judged,
        "quality_probes_not_judged": not_judged,
        **terms,
        **_sweep_terms(footprint, point, cell),
        "replicas": None if replicas is None else replicas["base"],
        **_price_terms(price, cell, machines, correct),
    }
    return MethodResult(
        "in_context",
        {"correct_revision": None, "quality": quality, "latency": latency, "isolation": None},
        _cost(price, cell, machines.machines, correct),
        float(machines.machines),
        cell.wall_s,
        all_terms,
    )
