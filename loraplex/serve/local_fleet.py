"""``LocalFleetState``: one ``loraplex serve`` seen as a fleet of one replica ("local").

It reads what ``/metrics`` reads (``engine.health()``, ``engine.load_snapshot()``,
``cache.summary()``), so a view costs the same however many adapters are cached. While the engine
is down the replica is reported unhealthy with what could still be read, never as an error: the
page that polls it is how an operator sees the engine is down.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from loraplex.clock import Clock
from loraplex.engine.protocol import EngineClient, EngineLoad
from loraplex.errors import EngineUnavailableError
from loraplex.residency.cache.view import CacheSummary
from loraplex.router.fleet_state import (
    LOCAL_REPLICA_ID,
    FleetState,
    ReplicaLoadView,
    ReplicaState,
    hits_of,
    no_hits,
    tiers_of,
)
from loraplex.server.cache_control import CacheControl

EVICTION_WINDOW_S = 60.0  # evictions_per_min counts the evictions of this many seconds
# One eviction sample per this many seconds at most, so the window holds ~61 samples however
# often the fleet is polled.
SAMPLE_SPACING_S = 1.0


class EvictionWindow:
    """Evictions over the last minute from a cumulative counter, sampled when asked.

    Keeps (time, total) samples at least ``SAMPLE_SPACING_S`` apart; the count is the current
    total minus the newest sample at least ``EVICTION_WINDOW_S`` old, or minus the oldest sample
    while none is that old (so the first minute counts only what happened since the first view).
    A total lower than the last sample means the counters restarted (the engine process did):
    the history starts again from it.
    """

    def __init__(self) -> None:
        self._samples: deque[tuple[float, int]] = deque()

    @property
    def num_samples(self) -> int:
        """Samples kept: at most about ``EVICTION_WINDOW_S / SAMPLE_SPACING_S + 1``."""
        return len(self._samples)

    def per_min(self, now_s: float, total: int) -> float:
        if self._samples and total < self._samples[-1][1]:
            self._samples.clear()
        if not self._samples or now_s - self._samples[-1][0] >= SAMPLE_SPACING_S:
            self._samples.append((now_s, total))
        start_s = now_s - EVICTION_WINDOW_S
        # Drop samples older than the baseline (the newest one at or before the window start).
        while len(self._samples) > 1 and self._samples[1][0] <= start_s:
            self._samples.popleft()
        return float(total - self._samples[0][1])


class LocalFleetState:
    """``FleetStateSource`` of one server: its engine and adapter cache as replica "local"."""

    def __init__(
        self,
        engine: EngineClient,
        cache: CacheControl | None,
        clock: Clock,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._engine = engine
        self._cache = cache
        self._clock = clock  # paces the eviction window
        self._wall_clock = wall_clock  # stamps ``FleetState.at_s`` (unix time)
        self._evictions = EvictionWindow()
        self._lock = threading.Lock()  # views are built on the thread pool, maybe two at once

    def fleet_state(self) -> FleetState:
        health = self._engine.health()
        up = health.up
        load = self._load()
        summary = self._summary()
        with self._lock:
            evictions_per_min = self._evictions_per_min(summary)
        replica = ReplicaState(
            replica_id=LOCAL_REPLICA_ID,
            healthy=up and load is not None and (self._cache is None or summary is not None),
            report_age_s=0.0,  # this server reports as it answers
            tiers=tiers_of(summary) if summary is not None else {},
            hits=hits_of(summary) if summary is not None else no_hits(),
            load=_load_view(load, evictions_per_min) if load is not None else None,
            down_reason=None if up else (health.down_reason or "the engine is down"),
        )
        return FleetState(at_s=self._wall_clock(), policy=None, replicas=(replica,))

    def _load(self) -> EngineLoad | None:
        try:
            return self._engine.load_snapshot()
        except EngineUnavailableError:  # the engine process is down or restarting
            return None

    def _summary(self) -> CacheSummary | None:
        if self._cache is None:
            return None
        try:
            return self._cache.summary()
        except EngineUnavailableError:  # the engine process (holding the cache) is down
            return None

    def _evictions_per_min(self, summary: CacheSummary | None) -> float:
        if summary is None:
            return 0.0
        total = sum(summary.stats.evictions.values())
        return self._evictions.per_min(self._clock.now(), total)


def _load_view(load: EngineLoad, evictions_per_min: float) -> ReplicaLoadView:
    return ReplicaLoadView(
        num_queued=load.num_waiting + load.num_adapter_wait,
        num_running=load.num_running,
        num_active_tokens=load.num_active_tokens,
        kv_usage=load.kv_usage,
        evictions_per_min=evictions_per_min,
    )
