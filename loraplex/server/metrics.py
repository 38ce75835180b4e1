"""Prometheus metrics of one server, in a registry of its own (never the process-global one).

Two families:

- loraplex's own (DESIGN.md §8): adapter cache counters and residency read from
  ``cache.snapshot()`` at scrape time; TTFT / TPOT histograms split by ``cold`` (the adapter was
  not in a GPU slot when the request arrived) and ``priority_class``; ``cold_start_rate``;
  per-priority-class request and token counters.
- the vLLM-compatible family the Gateway API Inference Extension / llm-d endpoint picker scrapes:
  ``vllm:num_requests_waiting``, ``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``
  (0-1) and ``vllm:lora_requests_info{max_lora,running_lora_adapters,waiting_lora_adapters}``
  whose value is the current Unix time. Adapters appear there as ``tenant/name`` (a ``model``
  string any gateway can send), comma-separated, sorted; an adapter is listed as running when a
  revision of it is in a GPU slot, and as waiting only when none is (the lists never overlap).

Two gauges of the engine's supervision (``engine/process.py``): ``loraplex_engine_up`` (1 while
the engine takes requests, 0 while its process is down or restarting) and
``loraplex_engine_restarts_total``. While the engine is down the families read from it (the
endpoint-picker family, the adapter cache's) are left out rather than reported as idle.

Every label takes values from a fixed set (tier, stage, cold, priority class, outcome); adapter ids
appear only inside the one ``lora_requests_info`` sample and in the admin residency view.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.protocol import EngineClient, EngineLoad, TokenDelta
from loraplex.errors import EngineUnavailableError
from loraplex.residency.ledger import CACHED_TIERS, Tier
from loraplex.server.deps import CacheControl

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def adapter_names(keys: Iterable[AdapterKey]) -> list[str]:
    return sorted({f"{key.tenant}/{key.name}" for key in keys})


def lora_info_labels(load: EngineLoad) -> tuple[str, str, str]:
    """``max_lora``, ``running_lora_adapters``, ``waiting_lora_adapters`` (disjoint lists)."""
    running = adapter_names(load.running_adapters)
    waiting = [name for name in adapter_names(load.waiting_adapters) if name not in running]
    return str(load.max_loras), ",".join(running), ",".join(waiting)


class EngineCollector(Collector):
    """The endpoint-picker family from ``engine.load_snapshot()`` at scrape time."""

    def __init__(self, engine: EngineClient, wall_clock: Callable[[], float]) -> None:
        self._engine = engine
        self._wall_clock = wall_clock

    def collect(self) -> Iterator[Metric]:
        try:
            load = self._engine.load_snapshot()
        except EngineUnavailableError:  # down: an idle-looking replica would attract traffic
            return
        yield GaugeMetricFamily(
            "vllm:num_requests_waiting",
            "Requests queued, including those waiting for their adapter to load.",
            value=load.num_waiting + load.num_adapter_wait,
        )
        yield GaugeMetricFamily(
            "vllm:num_requests_running", "Requests prefilling or decoding.", value=load.num_running
        )
        yield GaugeMetricFamily(
            "vllm:kv_cache_usage_perc", "Fraction (0-1) of KV-cache blocks in use.", load.kv_usage
        )
        info = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Adapters in GPU slots and adapters with queued requests; value: Unix time.",
            labels=("max_lora", "running_lora_adapters", "waiting_lora_adapters"),
        )
        info.add_metric(lora_info_labels(load), self._wall_clock())
        yield info
        states = GaugeMetricFamily(
            "engine_requests", "Requests in the engine by state.", labels=("state",)
        )
        states.add_metric(("waiting",), load.num_waiting)
        states.add_metric(("adapter_wait",), load.num_adapter_wait)
        states.add_metric(("running",), load.num_running)
        yield states


class HealthCollector(Collector):
    """The engine's supervision from ``engine.health()`` at scrape time."""

    def __init__(self, engine: EngineClient) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        health = self._engine.health()
        yield GaugeMetricFamily(
            "loraplex_engine_up", "1 while the engine takes requests; 0 while it is down.",
            value=1 if health.up else 0,
        )  # fmt: skip
        yield CounterMetricFamily(
            "loraplex_engine_restarts", "Engine process restart attempts since the server started.",
            value=health.num_restarts,
        )  # fmt: skip


class CacheCollector(Collector):
    """DESIGN.md §8 adapter-cache metrics from ``cache.snapshot()`` at scrape time."""

    def __init__(self, cache: CacheControl) -> None:
        self._cache = cache

    def collect(self) -> Iterator[Metric]:
        try:
            snapshot = self._cache.snapshot()
        except EngineUnavailableError:  # the engine process (holding the cache) is down
            return
        stats = snapshot.stats
        per_tier = (
            ("adapter_cache_hits", "Acquires served from L0, or filled from L1/L2.", stats.hits),
            ("adapter_evictions", "Adapter copies evicted per tier.", stats.evictions),
            ("adapter_loads", "Completed fills per tier.", stats.loads),
        )
        for name, doc, values in per_tier:
            counter = CounterMetricFamily(name, doc, labels=("tier",))
            for tier in CACHED_TIERS:
                counter.add_metric((tier.name,), values.get(tier, 0))
            yield counter
        yield CounterMetricFamily(
            "adapter_cache_misses", "Acquires that had to fetch from L3.", value=stats.misses
        )
        yield CounterMetricFamily(
            "adapter_reload_after_eviction",
            "Fills within the reload window after an eviction of the same copy.",
            value=sum(stats.reloads_after_eviction.values()),
        )
        yield CounterMetricFamily(
            "adapter_load_failures", "Loads that failed or were cancelled.", stats.load_failures
        )
        yield GaugeMetricFamily(
            "adapter_thrash_ratio", "Reloads after eviction over evictions.", stats.thrash_ratio
        )
        yield GaugeMetricFamily(
            "adapter_loads_in_flight", "Loads running, queued or blocked.", snapshot.num_loading
        )
        yield from _residency(stats.resident_count, stats.resident_bytes)
        stages = SummaryMetricFamily(
            "adapter_load_stage_seconds", "Seconds spent per load stage.", labels=("stage",)
        )
        for stage, summary in sorted(stats.stages.items()):
            stages.add_metric((stage.value,), count_value=summary.count, sum_value=summary.total_s)
        yield stages


def _residency(counts: Mapping[Tier, int], sizes: Mapping[Tier, int]) -> Iterator[Metric]:
    count = GaugeMetricFamily("adapter_resident_count", "Adapters per tier.", labels=("tier",))
    size = GaugeMetricFamily("adapter_resident_bytes", "Adapter bytes per tier.", labels=("tier",))
    for tier in CACHED_TIERS:
        count.add_metric((tier.name,), counts.get(tier, 0))
        size.add_metric((tier.name,), sizes.get(tier, 0))
    yield count
    yield size


class ServerMetrics:
    """The server's registry plus the per-request instruments it observes into."""

    def __init__(
        self,
        engine: EngineClient,
        cache: CacheControl | None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(EngineCollector(engine, wall_clock))
        self.registry.register(HealthCollector(engine))
        if cache is not None:
            self.registry.register(CacheCollector(cache))
        labels = ("cold", "priority_class")
        self.ttft = Histogram(
            "request_ttft_seconds", "Arrival to first token.", labels,
            buckets=_LATENCY_BUCKETS_S, registry=self.registry,
        )  # fmt: skip
        self.tpot = Histogram(
            "request_tpot_seconds", "Mean seconds per output token after the first.", labels,
            buckets=_LATENCY_BUCKETS_S, registry=self.registry,
        )  # fmt: skip
        self.queue_wait = Histogram(
            "request_queue_wait_seconds", "Arrival at the engine to first scheduled.", labels,
            buckets=_LATENCY_BUCKETS_S, registry=self.registry,
        )  # fmt: skip
        self.requests = Counter(
            "requests", "Finished generation requests.", ("priority_class", "outcome"),
            registry=self.registry,
        )  # fmt: skip
        self.tokens = Counter(
            "generated_tokens", "Tokens generated.", ("priority_class",), registry=self.registry
        )
        self._lock = threading.Lock()
        self._arrivals = {True: 0, False: 0}  # adapter requests by cold-at-arrival
        self.registry.register(_RateCollector(self))

    def start_request(self, priority_class: str, cold: bool, now_s: float) -> RequestObservation:
        with self._lock:
            self._arrivals[cold] += 1
        return RequestObservation(self, priority_class, cold, now_s)

    def cold_start_rate(self) -> float:
        with self._lock:
            total = self._arrivals[True] + self._arrivals[False]
            return self._arrivals[True] / total if total else 0.0

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _RateCollector(Collector):
    """``cold_start_rate``, computed at scrape time from the arrival counts."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "cold_start_rate",
            "Fraction of requests whose adapter was not in a GPU slot on arrival.",
            value=self._metrics.cold_start_rate(),
        )


class RequestObservation:
    """Timing of one request, fed by its deltas."""

    def __init__(self, metrics: ServerMetrics, priority_class: str, cold: bool, now_s: float):
        self._metrics = metrics
        self._labels = ("true" if cold else "false", priority_class)
        self._priority_class = priority_class
        self._arrived_s = now_s
        self._first_s: float | None = None
        self._last_s = now_s
        self._tokens = 0
        self._finished = False
        self.engine_tier: str | None = None  # the tier the engine leased the adapter from

    def on_delta(self, delta: TokenDelta, now_s: float) -> None:
        if delta.adapter_tier is not None and self.engine_tier is None:
            # The engine's word on where the adapter was when it leased it beats the guess made
            # on arrival (the residency can change between the two).
            self.engine_tier = delta.adapter_tier
            cold = "false" if delta.adapter_tier == "L0" else "true"
            self._labels = (cold, self._priority_class)
        if delta.queue_s is not None:
            self._metrics.queue_wait.labels(*self._labels).observe(delta.queue_s)
        if delta.token_ids and self._first_s is None:
            self._first_s = now_s
            self._metrics.ttft.labels(*self._labels).observe(now_s - self._arrived_s)
        if delta.token_ids:
            self._last_s = now_s
        self._tokens = delta.completion_tokens

    def finish(self, outcome: str) -> None:
        if self._finished:
            return
        self._finished = True
        if self._first_s is not None and self._tokens > 1:
            per_token = (self._last_s - self._first_s) / (self._tokens - 1)
            self._metrics.tpot.labels(*self._labels).observe(per_token)
        self._metrics.requests.labels(self._priority_class, outcome).inc()
        self._metrics.tokens.labels(self._priority_class).inc(self._tokens)
