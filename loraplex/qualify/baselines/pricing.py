"""The comparators' arithmetic: from measured load levels and a replica's footprint to the
machines a cell's traffic needs and the requests that pass (pure, no I/O, torch-free).

Every rule here favours the comparator where a choice exists, so that loraplex is compared with
each alternative at its best:

- a replica runs at the measured load level with the most *goodput* (completed requests per
  second that met both latency objectives): the level that minimises cost per correct request;
- replicas are packed onto machines like the measuring one by compute (sum of demand over
  capacity) and by memory (replicas times peak RSS over the machine's memory), whichever binds;
  machines are rented whole, as loraplex's own machine is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_EPS = 1e-9  # float slack before a floor/ceil (3 * 0.1 / 0.1 must be 3 replicas, not 4)


@dataclass(frozen=True)
class Sample:
    """One request of a load level, as the client saw it."""

    ok: bool  # completed with status 200 and no error event
    ttft_s: float | None  # send to first token; None without one
    tpot_s: float | None  # mean seconds per output token after the first; None below 2 tokens


@dataclass(frozen=True)
class LoadLevel:
    """A closed-loop run at one concurrency: ``concurrency`` clients, each sending its next
    request when the previous one ends."""

    concurrency: int  # clients at once
    wall_s: float  # first send to last answer
    samples: tuple[Sample, ...]  # every request sent

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"LoadLevel.concurrency must be >= 1, got {self.concurrency}")
        if not self.wall_s > 0:
            raise ValueError(f"LoadLevel.wall_s must be > 0, got {self.wall_s}")

    @property
    def completed_rps(self) -> float:
        return sum(s.ok for s in self.samples) / self.wall_s

    def latency_pass_ratio(self, ttft_slo_s: float, tpot_slo_s: float) -> float | None:
        """Requests that completed within both objectives over requests sent (a failed request
        fails); None when nothing was sent."""
        if not self.samples:
            return None
        passed = sum(
            s.ok
            and s.ttft_s is not None
            and s.ttft_s <= ttft_slo_s
            and (s.tpot_s is None or s.tpot_s <= tpot_slo_s)
            for s in self.samples
        )
        return passed / len(self.samples)


@dataclass(frozen=True)
class OperatingPoint:
    """The load level a replica is sized at, for one pair of latency objectives."""

    concurrency: int  # the level's clients
    capacity_rps: float  # its completed requests per second: one replica's capacity
    latency_pass_ratio: float  # its share of requests within both objectives
    goodput_rps: float  # capacity_rps * latency_pass_ratio


def operating_point(
    levels: Sequence[LoadLevel], ttft_slo_s: float, tpot_slo_s: float
) -> OperatingPoint:
    """The level with the most goodput (ties: the lower concurrency). With no goodput at any
    level, the one with the most capacity (its latency pass ratio, 0, says why)."""
    if not levels:
        raise ValueError("levels must hold at least one measured load level")
    points = []
    for level in sorted(levels, key=lambda lv: lv.concurrency):
        ratio = level.latency_pass_ratio(ttft_slo_s, tpot_slo_s) or 0.0
        rps = level.completed_rps
        points.append(OperatingPoint(level.concurrency, rps, ratio, rps * ratio))
    best = max(points, key=lambda p: (p.goodput_rps, p.capacity_rps, -p.concurrency))
    return best


def saturated(levels: Sequence[LoadLevel], margin: float = 0.1) -> bool:
    """Whether the sweep reached the server's plateau: its highest concurrency completed no
    more than ``margin`` above the best lower level. False: capacity is a lower bound."""
    ordered = sorted(levels, key=lambda lv: lv.concurrency)
    if len(ordered) < 2:
        return False
    best_below = max(lv.completed_rps for lv in ordered[:-1])
    return ordered[-1].completed_rps <= best_below * (1.0 + margin)


def replicas_needed(
    demand_rps: Mapping[str, float], capacity_rps: float, *, scale_to_zero: bool
) -> dict[str, int]:
    """Replicas per deployment: ceil(demand / capacity), at least one; an idle deployment has
    none when it scales to zero. ValueError when capacity is not positive and a deployment has
    traffic (no number of replicas serves it)."""
    out: dict[str, int] = {}
    for name, rps in demand_rps.items():
        if rps <= 0:
            out[name] = 0 if scale_to_zero else 1
            continue
        if not capacity_rps > 0:
            raise ValueError(f"capacity_rps {capacity_rps} cannot serve {name!r} at {rps} rps")
        out[name] = max(1, math.ceil(rps / capacity_rps - _EPS))
    return out


@dataclass(frozen=True)
class Machines:
    """Machines like the measuring one that a set of replicas needs."""

    by_compute: float  # total demand / one replica's capacity (a replica at capacity: a machine)
    by_memory: float  # replicas * replica peak memory / machine memory
    machines: int  # whole machines: ceil of the larger (0 with no replica)


def machines_for(
    demand_rps: Mapping[str, float],
    replicas: Mapping[str, int],
    capacity_rps: float,
    replica_memory_bytes: int,
    machine_memory_bytes: int,
) -> Machines:
    if machine_memory_bytes < 1:
        raise ValueError(f"machine_memory_bytes must be >= 1, got {machine_memory_bytes}")
    total = sum(replicas.values())
    if total == 0:
        return Machines(0.0, 0.0, 0)
    served = sum(rps for name, rps in demand_rps.items() if replicas.get(name, 0) > 0)
    compute = served / capacity_rps if capacity_rps > 0 else 0.0
    memory = total * replica_memory_bytes / machine_memory_bytes
    return Machines(compute, memory, max(1, math.ceil(max(compute, memory) - _EPS)))


def cold_share(demand_rps: Mapping[str, float], wall_s: float, *, scale_to_zero: bool) -> float:
    """The share of requests that find their deployment scaled to zero: a deployment with
    traffic starts cold, so its first request in the cell is cold; one expecting fewer than one
    request in the cell (idle between its requests) has every request cold."""
    if not scale_to_zero:
        return 0.0
    expected = [rps * wall_s for rps in demand_rps.values() if rps > 0]
    if not expected:
        return 0.0
    return sum(min(1.0, n) for n in expected) / sum(expected)


def latency_with_cold_starts(
    warm_ratio: float, share_cold: float, cold_start_s: float, ttft_slo_s: float
) -> float:
    """Latency pass ratio when ``share_cold`` of requests wait for a full model load first: they
    fail the TTFT objective when the load alone exceeds it, else pass as warm ones do."""
    if not 0.0 <= share_cold <= 1.0:
        raise ValueError(f"share_cold must be in [0, 1], got {share_cold}")
    cold_ratio = warm_ratio if cold_start_s <= ttft_slo_s else 0.0
    return warm_ratio * (1.0 - share_cold) + cold_ratio * share_cold


def correct_requests(requests: int, ratios: Sequence[float | None]) -> int | None:
    """Requests expected to pass every judged check: ``requests`` times the product of the
    ratios (checks taken as independent); None when a ratio is undefined."""
    if any(r is None for r in ratios):
        return None
    product = math.prod(r for r in ratios if r is not None)
    return math.floor(requests * product + _EPS)
