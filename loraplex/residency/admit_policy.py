"""``admit_gdsf``: a probation segment in front of a GreedyDual-Size-Frequency main segment.

Torch-free (the simulator and the replays reuse it). The ideas come from general caching:
S3-FIFO (SOSP '23) and W-TinyLFU admit a newcomer to a small probationary queue and promote it
only once it is requested again, so a sweep of one-hit wonders cycles through probation instead
of flushing the main cache; GDSF keeps what costs most to refetch per byte held. Here:

- **Probation.** A copy whose adapter has fewer than ``admit_count`` requests in the decaying
  5-minute counter (one-offs: its own request only) is probationary and goes before every
  protected copy, lower tenant priority first, then least recently used. Request history
  outlives residency (the cache keeps it for ``max_idle_keys`` idle keys), so a returning
  adapter is remembered like an S3-FIFO ghost entry and enters protected at once.
- **Protected.** The rest are ordered by keep = priority x rate x reload_cost_s / size_bytes:
  the refill seconds a copy is expected to save per second and per byte of room. The reload
  cost is the tier's own (``ReloadCosts``: an L0 copy refills from L1 cheaply, an L2 copy from
  the remote store dearly), so the same rule ranks GPU slots, CPU bytes and disk bytes.
- **Bounded deferral.** A lower-priority tenant's demand load may wait, for at most
  ``demand_defer_s`` per request (and never past the cache's ``max_request_deferral_s``),
  for a copy worth less than a higher-priority victim to free up; it never starves.

There is no minimum residency: a young one-off is exactly what should go first, and in-use
copies are never candidates anyway (the cache withholds them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from loraplex.residency.policy_base import FLOOR_SLACK, Candidate, OrderGroup, OrderKey
from loraplex.residency.warm import WINDOWS_S

# Time constant of the 5-minute counter the admission test reads (``RequestRates.per_5m``).
_ADMIT_WINDOW_S = WINDOWS_S[1]
_PROBATION = 0  # segment of copies not yet admitted: they go first
_PROTECTED = 1


@dataclass(frozen=True)
class AdmitGdsfConfig:
    """Parameters of ``admit_gdsf`` (searched on the bench cache replays; see
    docs/benchmarks/residency.md)."""

    # Requests (decaying 5-minute count, this one included) that admit a copy past probation.
    admit_count: float = 1.5
    short_weight: float = 0.5  # weight of the 1-minute rate against the 5-minute one
    # Recency bonus 1 / (idle seconds + tau) added to the rate; None: frequency only.
    recency_tau_s: float | None = 30.0
    # Staleness cap: a copy idle for d seconds is credited at most idle_cap / d requests per
    # second, so a rotated-out hot set stops looking hot within seconds, not minutes of decay.
    idle_cap: float | None = 2.0
    hysteresis: float = 0.25  # an optional load must beat its victims' keep by this fraction
    demand_defer_s: float = 0.1  # per-request bound on a lower-priority load's wait

    def __post_init__(self) -> None:
        if not self.admit_count >= 0:
            raise ValueError(f"admit_count {self.admit_count} is invalid; expected >= 0")
        if not 0 <= self.short_weight <= 1:
            raise ValueError(f"short_weight {self.short_weight} is invalid; expected in [0, 1]")
        if self.recency_tau_s is not None and not self.recency_tau_s > 0:
            raise ValueError(f"recency_tau_s {self.recency_tau_s} is invalid; expected > 0")
        if self.idle_cap is not None and not self.idle_cap > 0:
            raise ValueError(f"idle_cap {self.idle_cap} is invalid; expected > 0")
        if not self.hysteresis >= 0:
            raise ValueError(f"hysteresis {self.hysteresis} is invalid; expected >= 0")
        if not self.demand_defer_s >= 0:
            raise ValueError(f"demand_defer_s {self.demand_defer_s} is invalid; expected >= 0")


class AdmitGdsfPolicy:
    """Probation first (lower priority, then least recent), then protected by GDSF keep."""

    name = "admit_gdsf"

    def __init__(self, config: AdmitGdsfConfig | None = None) -> None:
        self.config = config or AdmitGdsfConfig()

    def admitted(self, c: Candidate) -> bool:
        """Whether ``c`` has left probation (requested often enough lately)."""
        return c.rates.per_5m * _ADMIT_WINDOW_S >= self.config.admit_count

    def keep_score(self, c: Candidate, now_s: float) -> float:
        cfg = self.config
        rate = cfg.short_weight * c.rates.per_1m + (1 - cfg.short_weight) * c.rates.per_5m
        idle_s = max(0.0, now_s - c.last_access_s)
        if cfg.idle_cap is not None and idle_s > 0:
            rate = min(rate, cfg.idle_cap / idle_s)
        if cfg.recency_tau_s is not None:
            rate += 1.0 / (idle_s + cfg.recency_tau_s)
        return c.priority * rate * c.reload_cost_s / max(1, c.size_bytes)

    def worth(self, c: Candidate, now_s: float) -> tuple[int, float]:
        """(segment, keep): what losing ``c`` costs, compared lexicographically."""
        segment = _PROTECTED if self.admitted(c) else _PROBATION
        return (segment, self.keep_score(c, now_s))

    def order_key(self, c: Candidate, now_s: float) -> OrderKey:
        if not self.admitted(c):
            return (_PROBATION, c.priority, c.last_access_s, c.key)
        return (_PROTECTED, self.keep_score(c, now_s), c.last_access_s, c.key)

    def order_key_floor(self, c: Candidate, now_s: float, until_s: float) -> OrderKey:
        """``c`` comes with its rates decayed to ``until_s`` (an idle copy's only fall): the
        segment there is the lowest it takes on the way, and within protected the keep there
        is the lowest (rates decay, the recency bonus shrinks). A probationary key does not
        move while the copy idles."""
        key = self.order_key(c, until_s)
        if key[0] == _PROBATION:
            return key
        score = self.keep_score(c, until_s)
        return (_PROTECTED, score - abs(score) * FLOOR_SLACK, c.last_access_s, c.key)

    def order_group(self, c: Candidate, now_s: float) -> OrderGroup | None:
        """Probationary copies of one priority are ranked by (last access, key) for good: an
        idle copy's counter only decays, so it never leaves probation until its next request
        (which re-indexes it). Protected copies are bounded alone."""
        if self.admitted(c):
            return None
        return OrderGroup((_PROBATION, c.priority), (c.last_access_s, c.key), math.inf)

    def order_victims(self, candidates: Sequence[Candidate], now_s: float) -> list[Candidate]:
        return sorted(candidates, key=lambda c: self.order_key(c, now_s))

    def admits(self, incoming: Candidate, victims: Sequence[Candidate], now_s: float) -> bool:
        """An optional load (prefetch, promotion) displaces only copies worth clearly less: a
        probationary newcomer never displaces a protected copy."""
        if not victims:
            return True
        segment, keep = self.worth(incoming, now_s)
        for victim in victims:
            v_segment, v_keep = self.worth(victim, now_s)
            if v_segment > segment or (
                v_segment == segment and keep <= v_keep * (1 + self.config.hysteresis)
            ):
                return False
        return True

    def deferral_s(
        self,
        incoming: Candidate,
        victims: Sequence[Candidate],
        held: Sequence[Candidate],
        waited_s: float,
        now_s: float,
    ) -> float:
        """Wait out the rest of ``demand_defer_s`` (counted from when the request asked) when
        a victim of a higher-priority tenant is worth more than the newcomer and some held
        copy (in use or loading) is worth less than that victim: it will free room soon
        without costing the higher tier anything. Within one priority class loads never wait."""
        left = self.config.demand_defer_s - waited_s
        above = [v for v in victims if v.priority > incoming.priority]
        if left <= 0 or not above or not held:
            return 0.0
        protect = max(self.worth(v, now_s) for v in above)
        if self.worth(incoming, now_s) >= protect:
            return 0.0
        return left if min(self.worth(c, now_s) for c in held) < protect else 0.0
