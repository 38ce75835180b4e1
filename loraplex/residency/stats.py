"""Adapter cache telemetry as plain objects (the server exports them to Prometheus).

Torch-free. ``CacheStats`` is mutated only under the cache's lock; ``snapshot()`` returns frozen
copies. Counters are per tier, never per adapter id (bounded label cardinality); per-adapter
counters live in ``AdapterHistory`` and surface through the cache's residency snapshot.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from loraplex.residency.ledger import CACHED_TIERS, Tier
from loraplex.residency.warm import RollingRates

# Stage samples kept for percentiles; older ones only count in count / total.
_MAX_STAGE_SAMPLES = 4096


class Stage(StrEnum):
    """Timed stages of an adapter load, in pipeline order."""

    RESOLVE = "resolve"  # adapter key -> artifact location and sizes
    FETCH = "fetch"  # L3 -> quarantine
    VERIFY = "verify"  # digest, manifest and tensor validation of the quarantined bytes
    COMMIT = "commit"  # quarantine -> L2 (atomic rename)
    READ = "read"  # L2 -> L1 (parse into CPU tensors)
    COPY = "copy"  # L1 -> L0 slot copy


@dataclass
class AdapterHistory:
    """Per-adapter counters, kept across evictions (frequency must survive residency)."""

    rates: RollingRates = field(default_factory=RollingRates)  # request rate windows
    # The same, of the requests of its owner and of asks that name no tenant: what earns an
    # automatic warm seat (``PinBook``), which counts in the owner's seat share and GPU cap.
    # NOTE: from every caller's requests, a caller's steady calls of another tenant's public
    # adapter could win that adapter one of its owner's automatic seats (squatres' residual).
    owner_rates: RollingRates = field(default_factory=RollingRates)
    # Rates of the requests that read each lower tier: those that missed every faster tier
    # (L1: missed L0; L2: missed L0 and L1). What a copy there is worth, not the raw rate.
    reads: dict[Tier, RollingRates] = field(
        default_factory=lambda: {Tier.L1: RollingRates(), Tier.L2: RollingRates()}
    )
    last_access_s: float = 0.0  # last acquire
    hits: dict[Tier, int] = field(default_factory=dict)  # acquires served from each tier
    loads: dict[Tier, int] = field(default_factory=dict)  # completed fills of each tier
    evictions: dict[Tier, int] = field(default_factory=dict)  # evictions from each tier
    evicted_at_s: dict[Tier, float] = field(default_factory=dict)  # last eviction per tier
    reloaded_at_s: dict[Tier, float] = field(default_factory=dict)  # last reload-after-eviction


@dataclass(frozen=True)
class StageSummary:
    """Durations of one load stage."""

    count: int  # stages timed
    total_s: float  # summed seconds
    p50_s: float  # median over the retained samples
    p95_s: float  # 95th percentile over the retained samples
    max_s: float  # slowest retained sample


@dataclass(frozen=True)
class CacheStatsSnapshot:
    """Cache telemetry at one instant."""

    hits: dict[Tier, int]  # acquires served from L0, or filled from L1 / L2
    misses: int  # acquires that had to go to L3
    loads: dict[Tier, int]  # completed fills per tier
    evictions: dict[Tier, int]  # evictions per tier
    reloads_after_eviction: dict[Tier, int]  # fills within the window after an eviction
    load_failures: int  # loads that failed or were cancelled (all undone)
    resident_count: dict[Tier, int]  # entries per tier
    resident_bytes: dict[Tier, int]  # bytes per tier
    stages: dict[Stage, StageSummary]  # per-stage load durations (pipeline work only)
    room_wait: StageSummary | None  # per move: waiting for room in its target (None: no moves)
    # reloads after eviction of a copy whose previous fill was one too, both within the window:
    # the same revision cycling in and out of a tier (thrash), not a one-off refill
    thrash_events: dict[Tier, int] = field(default_factory=dict)

    @property
    def thrash_ratio(self) -> float:
        """Reloads-after-eviction over evictions (0 when nothing was evicted)."""
        evicted = sum(self.evictions.values())
        return sum(self.reloads_after_eviction.values()) / evicted if evicted else 0.0


class CacheStats:
    """Mutable counters of one cache (guarded by the cache's lock)."""

    def __init__(self, reload_window_s: float) -> None:
        if reload_window_s <= 0:
            raise ValueError(f"reload_window_s {reload_window_s} is invalid; expected > 0")
        self.reload_window_s = reload_window_s
        self.hits = dict.fromkeys(CACHED_TIERS, 0)
        self.misses = 0
        self.loads = dict.fromkeys(CACHED_TIERS, 0)
        self.evictions = dict.fromkeys(CACHED_TIERS, 0)
        self.reloads_after_eviction = dict.fromkeys(CACHED_TIERS, 0)
        self.thrash_events = dict.fromkeys(CACHED_TIERS, 0)
        self.load_failures = 0
        self._stage_count = dict.fromkeys(Stage, 0)
        self._stage_total = dict.fromkeys(Stage, 0.0)
        self._stage_samples: dict[Stage, deque[float]] = {
            s: deque(maxlen=_MAX_STAGE_SAMPLES) for s in Stage
        }
        # Waiting for room is no pipeline stage: kept apart so stage seconds stay work.
        self._room_wait_count = 0
        self._room_wait_total = 0.0
        self._room_wait_samples: deque[float] = deque(maxlen=_MAX_STAGE_SAMPLES)

    def record_hit(self, tier: Tier, history: AdapterHistory) -> None:
        self.hits[tier] += 1
        history.hits[tier] = history.hits.get(tier, 0) + 1

    def record_load(self, tier: Tier, history: AdapterHistory, now_s: float) -> None:
        self.loads[tier] += 1
        history.loads[tier] = history.loads.get(tier, 0) + 1
        evicted_at = history.evicted_at_s.get(tier)
        if evicted_at is None or now_s - evicted_at > self.reload_window_s:
            return
        self.reloads_after_eviction[tier] += 1
        reloaded_at = history.reloaded_at_s.get(tier)
        if reloaded_at is not None and now_s - reloaded_at <= self.reload_window_s:
            self.thrash_events[tier] += 1  # evicted and refilled again within the window
        history.reloaded_at_s[tier] = now_s

    def record_eviction(self, tier: Tier, history: AdapterHistory, now_s: float) -> None:
        self.evictions[tier] += 1
        history.evictions[tier] = history.evictions.get(tier, 0) + 1
        history.evicted_at_s[tier] = now_s

    def record_stage(self, stage: Stage, seconds: float) -> None:
        self._stage_count[stage] += 1
        self._stage_total[stage] += seconds
        self._stage_samples[stage].append(seconds)

    def record_room_wait(self, seconds: float) -> None:
        self._room_wait_count += 1
        self._room_wait_total += seconds
        self._room_wait_samples.append(seconds)

    def snapshot(
        self, resident_count: dict[Tier, int], resident_bytes: dict[Tier, int]
    ) -> CacheStatsSnapshot:
        return CacheStatsSnapshot(
            hits=dict(self.hits),
            misses=self.misses,
            loads=dict(self.loads),
            evictions=dict(self.evictions),
            reloads_after_eviction=dict(self.reloads_after_eviction),
            load_failures=self.load_failures,
            resident_count=dict(resident_count),
            resident_bytes=dict(resident_bytes),
            stages={
                s: _summary(self._stage_count[s], self._stage_total[s], self._stage_samples[s])
                for s in Stage
                if self._stage_count[s]
            },
            room_wait=_summary(
                self._room_wait_count, self._room_wait_total, self._room_wait_samples
            )
            if self._room_wait_count
            else None,
            thrash_events=dict(self.thrash_events),
        )


def _summary(count: int, total_s: float, retained: deque[float]) -> StageSummary:
    samples = sorted(retained)
    return StageSummary(
        count=count,
        total_s=total_s,
        p50_s=percentile(samples, 0.50),
        p95_s=percentile(samples, 0.95),
        max_s=samples[-1],
    )


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 for an empty one)."""
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]
