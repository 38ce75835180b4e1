"""Prometheus metrics of one server, in a registry of its own (never the process-global one).

Two families:

- loraplex's own (DESIGN.md §8): adapter cache counters and per-tier totals read from
  ``cache.summary()`` at scrape time (in process mode the state the engine child published: no
  round trip, and the same cost however many copies are cached); TTFT / TPOT / queue-wait
  histograms split by ``cold`` and ``priority_class``; ``cold_start_rate``; per-priority-class
  request and token counters.

  NOTE: two notions of cold. ``cold_start_rate`` counts requests whose adapter was not in a GPU
  slot when the request arrived (the server's view). The ``cold`` label of the histograms is the
  engine's word once it leased the adapter (``TokenDelta.adapter_tier`` is not L0), since that
  is what the latency paid for; until the engine says so it is the arrival-time guess.
- the vLLM-compatible family the Gateway API Inference Extension / llm-d endpoint picker scrapes:
  ``vllm:num_requests_waiting``, ``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``
  (0-1), each labelled ``model_name`` (the served base model's name, as vLLM labels them), and
  ``vllm:lora_requests_info{max_lora,running_lora_adapters,waiting_lora_adapters}``
  whose value is the current Unix time. Adapters appear there as ``tenant/name`` (a ``model``
  string any gateway can send), comma-separated, sorted; as vLLM means them, an adapter is
  listed as running while a request of it runs (prefills or decodes, not paused) and as waiting
  while one is queued (for a seat or its adapter's load), in both with both; an idle adapter in
  a GPU slot is in neither (they listed the slots, docs/kubernetes.md says why not).

Two gauges of the engine's supervision (``engine/transport/process.py``):
``loraplex_engine_up`` (1 while the engine takes requests, 0 while its process is down or
restarting) and ``loraplex_engine_restarts_total``. While the engine is down the families read
from it (the endpoint-picker family, the adapter cache's) are left out rather than reported as
idle.

Every label takes values from a fixed set (tier, stage, cold, priority class, outcome) or a
bounded one: adapter names appear in ``lora_requests_info``'s lists and in
``adapter_requests_total{adapter, priority_class}`` only for at most ``max_adapter_labels``
adapters at a time, every other adapter as ``__other__`` (``server/adapter_labels.py``); and in the
release family (``loraplex_release_*``, see ``metrics_collectors.ReleaseCollector``), whose series
exist only for the revisions of active releases (``release/traffic.py``).

Each request also feeds the release traffic windows (its revision, if under release) and the
recent-requests map behind ``POST /v1/feedback``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from loraplex.engine.protocol import EngineClient, TokenDelta
from loraplex.engine.trace_log import EngineTrace
from loraplex.release.traffic import (
    ReleaseTraffic,
    caller_key,
    classify,
)
from loraplex.residency.ledger import Tier
from loraplex.server.adapter_labels import DEFAULT_MAX_NAMED, AdapterLabels
from loraplex.server.cache_control import CacheControl
from loraplex.server.metrics_collectors import (
    AdapterRequestsCollector,
    CacheCollector,
    EngineCollector,
    HealthCollector,
    ReleaseCollector,
)
from loraplex.server.metrics_modes import ModeCollector
from loraplex.server.metrics_status import StatusCounts
from loraplex.server.metrics_traces import TraceCollector
from loraplex.server.recent_requests import RecentRequests
from loraplex.server.request_log import LoggedRequest, RequestLog
from loraplex.server.traffic_tally import TrafficTally
from loraplex.tracing.record import RequestTracing

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


# the request log, tenant, prompt tokens, max_tokens, the revision's rank and bytes once loaded
Logged = tuple[RequestLog, str, int, int, int | None, int | None]


class ServerMetrics:
    """The server's registry plus the per-request instruments it observes into."""

    def __init__(
        self,
        engine: EngineClient,
        cache: CacheControl | None,
        wall_clock: Callable[[], float] = time.time,
        *,
        releases: ReleaseTraffic,
        recent: RecentRequests,
        model_name: str,
        max_adapter_labels: int = DEFAULT_MAX_NAMED,
        traffic: TrafficTally | None = None,
        request_log: RequestLog | None = None,
        tracing: RequestTracing | None = None,
    ) -> None:
        self.request_log = request_log  # one line per finished request; None: off
        # per-class and per-revision traffic between the live page's history samples
        self.traffic = traffic if traffic is not None else TrafficTally()
        self.releases = releases  # windows of the revisions under release
        self.recent = recent  # (tenant, response id) -> revision (client feedback)
        self.adapter_labels = AdapterLabels(max_adapter_labels)  # adapters named in labels
        self.registry = CollectorRegistry(auto_describe=True)
        # the served base model's name: vLLM's ``model_name`` label of the ``vllm:`` gauges
        engine_family = EngineCollector(engine, wall_clock, model_name, self.adapter_labels)
        self.registry.register(engine_family)
        self.registry.register(AdapterRequestsCollector(self.adapter_labels))
        self.registry.register(HealthCollector(engine))
        self.registry.register(ModeCollector(engine))
        if cache is not None:
            self.registry.register(CacheCollector(cache))
        self.registry.register(ReleaseCollector(releases))
        if tracing is not None:  # the tracer's refused sampled flags
            self.registry.register(TraceCollector(tracing))
        self.statuses = StatusCounts()  # tenant responses by class and status (middleware)
        self.registry.register(self.statuses)
        labels = ("cold", "priority_class")
        self.ttft = Histogram(
            "request_ttft_seconds",
            "Arrival to first token.",
            labels,
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.tpot = Histogram(
            "request_tpot_seconds",
            "Mean seconds per output token after the first.",
            labels,
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "request_queue_wait_seconds",
            "Arrival at the engine to first scheduled.",
            labels,
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.requests = Counter(
            "requests",
            "Finished generation requests.",
            ("priority_class", "outcome"),
            registry=self.registry,
        )
        self.tokens = Counter(
            "generated_tokens", "Tokens generated.", ("priority_class",), registry=self.registry
        )
        self._lock = threading.Lock()
        self._arrivals = {True: 0, False: 0}  # adapter requests by cold-at-arrival
        self._started = 0  # requests started (tells apart callers that name no key)
        self.registry.register(_RateCollector(self))

    def start_request(
        self,
        priority_class: str,
        cold: bool,
        now_s: float,
        *,
        revision: str | None = None,
        tenant: str | None = None,
        response_id: str | None = None,
        sticky_key: str | None = None,
        prompt_tokens: int = 0,
        max_tokens: int = 0,
        shape: tuple[int | None, int | None] = (None, None),
    ) -> RequestObservation:
        """Starts timing one request. ``revision`` (``tenant/name@revision``; None: the base
        model), ``tenant``, ``response_id`` (the ``id`` the client sees) and ``sticky_key``
        (the caller's ``user`` / ``X-Session-Id``) feed the release traffic windows and client
        feedback (issue 13); ``prompt_tokens``, ``max_tokens`` and ``shape`` (the revision's
        rank and bytes once loaded) the request log."""
        with self._lock:
            self._arrivals[cold] += 1
            self._started += 1
            fallback = f"{self._started}:{response_id}"  # unique even when ids are re-used
        if revision is not None:
            self.adapter_labels.count_request(revision.partition("@")[0], priority_class)
        caller = ""
        if revision is not None and tenant is not None:
            caller = caller_key(revision, tenant, sticky_key, fallback)
        if response_id is not None and tenant is not None:
            self.recent.remember(tenant, response_id, revision, caller)
        observation = RequestObservation(self, priority_class, cold, now_s)
        observation.revision = revision
        observation.caller = caller
        if self.request_log is not None and tenant is not None:
            observation.logged = (self.request_log, tenant, prompt_tokens, max_tokens, *shape)
        return observation

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
        # The name of the tier the engine leased the adapter from ("L0"), as the response
        # reports it (``RevisionInfo.tier``); None until the engine said so.
        self.engine_tier: str | None = None
        self.revision: str | None = None  # tenant/name@revision answering; None: base model
        self.caller = ""  # ``release.traffic.caller_key`` of who asked
        self._error: BaseException | None = None  # what the stream raised, if it did
        # The request log and what it records beside the timings (tenant, prompt tokens,
        # max_tokens, the revision's rank and bytes); None: not logged.
        self.logged: Logged | None = None
        self.engine_trace: EngineTrace | None = None  # the engine's stages, on its last delta

    def on_delta(self, delta: TokenDelta, now_s: float) -> None:
        if delta.adapter_tier is not None and self.engine_tier is None:
            # The engine's word on where the adapter was when it leased it beats the guess made
            # on arrival (the residency can change between the two).
            self.engine_tier = delta.adapter_tier.name
            cold = "false" if delta.adapter_tier is Tier.L0 else "true"
            self._labels = (cold, self._priority_class)
        if delta.trace is not None:
            self.engine_trace = delta.trace
        if delta.queue_s is not None:
            self._metrics.queue_wait.labels(*self._labels).observe(delta.queue_s)
        if delta.token_ids and self._first_s is None:
            self._first_s = now_s
            self._metrics.ttft.labels(*self._labels).observe(now_s - self._arrived_s)
        if delta.token_ids:
            self._last_s = now_s
        self._tokens = delta.completion_tokens

    @property
    def failed(self) -> bool:
        """Whether ``fail`` recorded an error."""
        return self._error is not None

    def fail(self, error: BaseException) -> None:
        """Records what failed the request (decides whether it counts against its revision:
        ``release.traffic.classify``); ``finish("error")`` follows."""
        self._error = error

    def finish(self, outcome: str) -> None:
        if self._finished:
            return
        self._finished = True
        per_token: float | None = None
        if self._first_s is not None and self._tokens > 1:
            per_token = (self._last_s - self._first_s) / (self._tokens - 1)
            self._metrics.tpot.labels(*self._labels).observe(per_token)
        self._metrics.requests.labels(self._priority_class, outcome).inc()
        self._metrics.tokens.labels(self._priority_class).inc(self._tokens)
        self._metrics.traffic.record(self._priority_class, self.revision, self._tokens, outcome)
        if self.logged is not None:
            self._log(outcome, self.logged)
        if self.revision is not None:
            ttft = None if self._first_s is None else self._first_s - self._arrived_s
            verdict = classify(outcome, self._error)
            self._metrics.releases.record(self.revision, verdict, ttft, per_token, self.caller)

    def _log(self, outcome: str, logged: Logged) -> None:
        """The request log's line for this request (``server/request_log.py``)."""
        log, tenant, prompt_tokens, max_tokens, rank, size_bytes = logged
        now_s = time.monotonic()
        log.write(
            LoggedRequest(
                arrived_s=self._arrived_s,
                tenant=tenant,
                revision=self.revision,
                prompt_tokens=prompt_tokens,
                max_tokens=max_tokens,
                completion_tokens=self._tokens,
                outcome=outcome,
                ttft_s=None if self._first_s is None else self._first_s - self._arrived_s,
                tier=self.engine_tier,
                latency_s=max(0.0, now_s - self._arrived_s),
                engine=self.engine_trace,
                rank=rank,
                size_bytes=size_bytes,
            )
        )
