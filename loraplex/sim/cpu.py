"""The machine's CPU shared by a deployment's processes (a cost model's ``cores``).

Every replica's step and every request's hop (the front's work, and in a fleet the ingress's
and proxy's) is a CPU job. A step that starts while ``n`` other jobs run costs
``max(1, (n + 1) / cores)`` times its price: with more jobs than cores each gets its share.
The factor is read once, when the step starts; a hop's own time is not stretched (its
measured spread, ``hop_jitter_s``, already holds the contention it met when measured).
"""

from __future__ import annotations

import heapq


class CpuShare:
    """Counts the CPU jobs running at a time on the virtual clock."""

    def __init__(self, cores: int) -> None:
        if cores < 1:
            raise ValueError(f"cores {cores} is invalid; expected >= 1")
        self.cores = cores
        self.steps = 0  # replicas running a step now (each replica counts its own in and out)
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
        return max(1.0, (self.jobs(now_s) + 1) / self.cores)
