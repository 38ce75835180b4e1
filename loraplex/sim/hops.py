"""A request's way from the front to its engine on the virtual clock (``sim/run.py`` charges
each request that reaches an engine once, in trace order)."""

from __future__ import annotations

import random

from loraplex.sim.cost_model import CostModel
from loraplex.sim.cpu import CpuShare
from loraplex.sim.replica import SimReplica


class Hops:
    """Each request's way from the front to its engine: the cost model's front, IPC and (a
    fleet) network seconds, its jitter, the first reply's one-time work, a lone server's busy
    hop and the machine's CPU share (``sim/cpu.py``)."""

    def __init__(self, cost: CostModel, fleet: bool, seed: int, cpu: CpuShare | None) -> None:
        self._cost = cost
        self._fleet = fleet
        self._base_s = cost.front_s + cost.ipc_s + (cost.network_s if fleet else 0.0)
        # Its own stream (string seeds hash by SHA-512: the same in every process), drawn once
        # per request that reaches an engine, in trace order, so the router's random choices
        # are the same with or without it.
        jittered = bool(cost.hop_jitter_s or (cost.network_jitter_s if fleet else ()))
        self._jitter = random.Random(f"hop-jitter-{seed}") if jittered else None
        self._first = True  # the front's first reply to reach an engine is still to come
        self._busy = BusyHop(cost.hop_busy_s if not fleet else 0.0)  # a lone server's only
        self._cpu = cpu

    def charged(self, replica: SimReplica, t_s: float) -> float:
        """The hop of a request arriving at ``t_s`` for ``replica``, counted in flight."""
        hop = self._base_s
        if self._jitter is not None:
            jitter = self._cost.hop_jitter(self._jitter.random(), self._fleet)
            hop = max(0.0, self._base_s + jitter)
        if self._first:  # its one-time work (0 without ``first_hop_s``)
            hop, self._first = hop + self._cost.first_hop_s, False
        hop = self._busy.added(replica, t_s, hop)
        cpu = self._cpu
        if cpu is not None:
            cpu.requests += 1  # its replica counts its end
            hop *= cpu.hop_stretch()  # 1 without a contention curve
            cpu.add_hop(t_s, t_s + hop)
        return hop


class BusyHop:
    """A lone server's busy hop (``CostModel.hop_busy_s``): added to a request's hop when
    another request is in flight on the server at its arrival, live in its engine or still on
    its way in (its hop not ended)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._hops_end = 0.0  # when the last hop charged so far ends

    def added(self, replica: SimReplica, t_s: float, hop: float) -> float:
        """``hop`` of a request arriving at ``t_s``, with the busy seconds when they apply."""
        if not self.seconds:
            return hop
        if replica.num_live or self._hops_end > t_s:
            hop += self.seconds
        self._hops_end = max(self._hops_end, t_s + hop)
        return hop
