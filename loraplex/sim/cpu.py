"""The machine's CPU shared by a deployment's processes (a cost model's ``cores``, or in a fleet
its measured ``fleet_contention``).

With ``cores``: every replica's step and every request's hop (the front's work, and in a fleet
the ingress's and proxy's) is a CPU job. A step that starts while ``n`` other jobs run costs
``max(1, (n + 1) / cores)`` times its price: with more jobs than cores each gets its share.
The factor is read once, when the step starts; a hop's own time is not stretched (its
measured spread, ``hop_jitter_s``, already holds the contention it met when measured).

With a fleet's ``Contention`` (measured by ``sim calibrate-fleet``: the fleet's throughput with
``k`` requests in flight), the factor is the measured stretch at the requests in flight in the
fleet (arrived at its ingress, not ended) instead: it replaces the jobs count, which sees one
job per hop and per step where the real fleet's proxy, ingress and background loops do more
work per request. It stretches steps (read when a step starts) and hops (read at arrival).
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Contention:
    """A fleet's measured slowdown per request with requests in flight: with ``in_flight[i]``
    requests in flight each one takes ``stretch[i]`` times as long as alone (``k`` over the
    throughput at ``k`` times a lone request's time). Linear between the points and past the
    last one (the last segment's slope, at least 0: a saturated CPU's per-request time grows
    with the queue); 1 at one request (a lone request is priced by the rest of the model)."""

    in_flight: tuple[int, ...]  # requests in flight, ascending, the first 1
    stretch: tuple[float, ...]  # the slowdown at each, >= 1, the first 1

    def __post_init__(self) -> None:
        where = f"fleet_contention {list(self.in_flight)} / {list(self.stretch)}"
        if len(self.in_flight) < 2 or len(self.in_flight) != len(self.stretch):
            raise ValueError(f"{where} is invalid; expected >= 2 points, as many of each")
        counts_ok = all(isinstance(k, int) and not isinstance(k, bool) for k in self.in_flight)
        if not counts_ok or self.in_flight[0] != 1:
            raise ValueError(f"{where} is invalid; expected in_flight integers from 1")
        if any(b <= a for a, b in itertools.pairwise(self.in_flight)):
            raise ValueError(f"{where} is invalid; expected in_flight strictly ascending")
        if not all(math.isfinite(s) and s >= 1 for s in self.stretch) or self.stretch[0] != 1:
            raise ValueError(f"{where} is invalid; expected finite stretch >= 1, the first 1")

    def at(self, requests: int) -> float:
        """The stretch with ``requests`` in flight (1 or fewer: 1)."""
        points, values = self.in_flight, self.stretch
        if requests <= 1:
            return 1.0
        if requests >= points[-1]:
            slope = (values[-1] - values[-2]) / (points[-1] - points[-2])
            return values[-1] + max(slope, 0.0) * (requests - points[-1])
        high = next(i for i, k in enumerate(points) if k >= requests)
        low = high - 1
        slope = (values[high] - values[low]) / (points[high] - points[low])
        return values[low] + slope * (requests - points[low])


class CpuShare:
    """Counts the CPU jobs running at a time on the virtual clock, and the requests in flight."""

    def __init__(self, cores: int | None, contention: Contention | None = None) -> None:
        if cores is None and contention is None:
            raise ValueError("CpuShare needs cores or a contention curve")
        if cores is not None and cores < 1:
            raise ValueError(f"cores {cores} is invalid; expected >= 1")
        self.cores = cores
        self.contention = contention
        self.steps = 0  # replicas running a step now (each replica counts its own in and out)
        self.requests = 0  # requests arrived and not ended (each replica counts its ends)
        self._hop_ends: list[float] = []  # heap of the hops' end times

    def add_hop(self, start_s: float, end_s: float) -> None:
        """A request's hop runs from ``start_s`` (its arrival) to ``end_s``."""
        if end_s > start_s:
            heapq.heappush(self._hop_ends, end_s)

    def jobs(self, now_s: float) -> int:
        """Jobs running at ``now_s``: replicas in a step, and hops not ended. Hops are fed in
        arrival order and a step starts at or after every hop fed so far has started."""
        ends = self._hop_ends
        while ends and ends[0] <= now_s:
            heapq.heappop(ends)
        return len(ends) + self.steps

    def stretch(self, now_s: float) -> float:
        """The factor of a step starting at ``now_s`` (its replica not yet counted in a step)."""
        if self.contention is not None:
            return self.contention.at(self.requests)
        assert self.cores is not None  # the constructor requires one of the two
        return max(1.0, (self.jobs(now_s) + 1) / self.cores)

    def hop_stretch(self) -> float:
        """The factor of a hop starting now (its request counted): the contention curve's; 1
        with ``cores`` alone (module docstring)."""
        return 1.0 if self.contention is None else self.contention.at(self.requests)
