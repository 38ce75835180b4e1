"""Scrape-time collectors of ``server/metrics.py``: the engine's load (the vLLM-compatible
family the endpoint picker reads), its supervision, and the adapter cache's counters. Each reads
state that is already published (``engine.load_snapshot()``, ``engine.health()``,
``cache.summary()``, the release traffic's counters), so a scrape never waits on the engine or the
database."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.protocol import EngineClient, EngineLoad
from loraplex.errors import EngineUnavailableError
from loraplex.release.model import ReleaseState
from loraplex.release.traffic import CANDIDATE, ReleaseTraffic
from loraplex.residency.ledger import CACHED_TIERS, Tier
from loraplex.server.adapter_labels import AdapterLabels
from loraplex.server.cache_control import CacheControl


def adapter_names(keys: Iterable[AdapterKey]) -> list[str]:
    return sorted({f"{key.tenant}/{key.name}" for key in keys})


def lora_info_labels(load: EngineLoad, names: AdapterLabels) -> tuple[str, str, str]:
    """``max_lora``, ``running_lora_adapters``, ``waiting_lora_adapters``, as vLLM means them:
    the labels (names, or ``OTHER`` past the cap on named adapters) of the adapters with a
    running request and of those with a queued one (an adapter with both is in both), not of
    the adapters resident in GPU slots: the endpoint picker's LoRA-affinity scorer reads
    ``len(running) + len(waiting) < max_lora`` as room for one more adapter in the batch,
    which slots filled with idle adapters never left (docs/kubernetes.md)."""
    running = names.labels(adapter_names(load.lora_running))
    waiting = names.labels(adapter_names(load.lora_waiting))
    return str(load.max_loras), ",".join(running), ",".join(waiting)


def _model_gauge(name: str, documentation: str, model_name: str, value: float) -> Metric:
    gauge = GaugeMetricFamily(name, documentation, labels=("model_name",))
    gauge.add_metric((model_name,), value)
    return gauge


class EngineCollector(Collector):
    """The endpoint-picker family from ``engine.load_snapshot()`` at scrape time. The three
    gauges carry vLLM's ``model_name`` label (the served base model's name), as vLLM's do, so a
    vLLM dashboard's ``{model_name="..."}`` filter finds them; ``vllm:lora_requests_info`` has
    none in vLLM either (its labels are the three below)."""

    def __init__(
        self,
        engine: EngineClient,
        wall_clock: Callable[[], float],
        model_name: str,
        names: AdapterLabels | None = None,
    ) -> None:
        self._engine = engine
        self._wall_clock = wall_clock
        self._model_name = model_name
        self._names = names or AdapterLabels()

    def collect(self) -> Iterator[Metric]:
        try:
            load = self._engine.load_snapshot()
        except EngineUnavailableError:  # down: an idle-looking replica would attract traffic
            return
        model = self._model_name
        yield _model_gauge(
            "vllm:num_requests_waiting",
            "Requests queued, including those waiting for their adapter to load.",
            model,
            load.num_waiting + load.num_adapter_wait,
        )
        yield _model_gauge(
            "vllm:num_requests_running", "Requests prefilling or decoding.", model, load.num_running
        )
        yield _model_gauge(
            "vllm:kv_cache_usage_perc",
            "Fraction (0-1) of KV-cache blocks in use.",
            model,
            load.kv_usage,
        )
        info = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Adapters with running requests and adapters with queued requests; value: Unix time.",
            labels=("max_lora", "running_lora_adapters", "waiting_lora_adapters"),
        )
        info.add_metric(lora_info_labels(load, self._names), self._wall_clock())
        yield info
        states = GaugeMetricFamily(
            "engine_requests", "Requests in the engine by state.", labels=("state",)
        )
        states.add_metric(("waiting",), load.num_waiting)
        states.add_metric(("adapter_wait",), load.num_adapter_wait)
        states.add_metric(("running",), load.num_running)
        states.add_metric(("paused",), load.num_paused)  # their clients stopped reading
        yield states
        yield CounterMetricFamily(
            "engine_request_pauses",
            "Requests paused because their clients stopped reading (since the engine started).",
            value=load.num_pauses,
        )
        yield CounterMetricFamily(
            "engine_request_resumes",
            "Paused requests resumed once their clients read again (since the engine started).",
            value=load.num_resumes,
        )
        yield CounterMetricFamily(
            "engine_request_pauses_kv_kept",
            "Pauses that kept the request's KV blocks, so that its resume recomputes nothing "
            "(since the engine started).",
            value=load.num_pauses_kv_kept,
        )
        yield CounterMetricFamily(
            "engine_paused_kv_freed",
            "KV blocks kept across a pause freed for other work before their request ran "
            "again; that request recomputes (since the engine started).",
            value=load.num_paused_kv_freed,
        )
        yield CounterMetricFamily(
            "engine_resume_recomputed_tokens",
            "Tokens paused requests computed again once resumed, their KV blocks freed by the "
            "pause or for other work meanwhile (since the engine started).",
            value=load.num_resume_recomputed_tokens,
        )


class AdapterRequestsCollector(Collector):
    """``adapter_requests_total{adapter, priority_class}``: requests per named adapter, the
    rest under ``adapter="__other__"`` per class (``adapter_labels``)."""

    def __init__(self, names: AdapterLabels) -> None:
        self._names = names

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "adapter_requests",
            "Adapter requests started, per adapter (past the cap on named ones: __other__).",
            labels=("adapter", "priority_class"),
        )
        for label, priority_class, count in self._names.request_totals():
            requests.add_metric((label, priority_class), count)
        yield requests


class HealthCollector(Collector):
    """The engine's supervision from ``engine.health()`` at scrape time."""

    def __init__(self, engine: EngineClient) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        health = self._engine.health()
        yield GaugeMetricFamily(
            "loraplex_engine_up",
            "1 while the engine takes requests; 0 while it is down.",
            value=1 if health.up else 0,
        )
        yield GaugeMetricFamily(
            "loraplex_engine_hung",
            "1 while the engine is alive but made no progress with work pending (watchdog).",
            value=1 if health.hung else 0,
        )
        yield CounterMetricFamily(
            "loraplex_engine_restarts",
            "Engine process restart attempts since the server started.",
            value=health.num_restarts,
        )


class CacheCollector(Collector):
    """DESIGN.md §8 adapter-cache metrics from ``cache.summary()`` at scrape time."""

    def __init__(self, cache: CacheControl) -> None:
        self._cache = cache

    def collect(self) -> Iterator[Metric]:
        try:
            summary = self._cache.summary()
        except EngineUnavailableError:  # the engine process (holding the cache) is down
            return
        stats = summary.stats
        per_tier = (
            ("adapter_cache_hits", "Acquires served from L0, or filled from L1/L2.", stats.hits),
            ("adapter_evictions", "Adapter copies evicted per tier.", stats.evictions),
            ("adapter_loads", "Completed fills per tier.", stats.loads),
            (
                "adapter_reload_after_eviction",
                "Fills within the reload window after an eviction of the same copy, per tier.",
                stats.reloads_after_eviction,
            ),
            (
                "adapter_thrash_events",
                "Reloads after eviction of a copy whose previous fill was one too (window).",
                stats.thrash_events,
            ),
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
            "adapter_load_failures", "Loads that failed or were cancelled.", stats.load_failures
        )
        yield GaugeMetricFamily(
            "adapter_thrash_ratio", "Reloads after eviction over evictions.", stats.thrash_ratio
        )
        yield GaugeMetricFamily(
            "adapter_loads_in_flight", "Loads running, queued or blocked.", summary.num_loading
        )
        yield from _residency(summary.num_copies, summary.used_bytes)
        stages = SummaryMetricFamily(
            "adapter_load_stage_seconds", "Seconds spent per load stage.", labels=("stage",)
        )
        for stage, stage_summary in sorted(stats.stages.items()):
            stages.add_metric(
                (stage.value,), count_value=stage_summary.count, sum_value=stage_summary.total_s
            )
        yield stages


def _residency(counts: Mapping[Tier, int], sizes: Mapping[Tier, int]) -> Iterator[Metric]:
    count = GaugeMetricFamily("adapter_resident_count", "Adapters per tier.", labels=("tier",))
    size = GaugeMetricFamily("adapter_resident_bytes", "Adapter bytes per tier.", labels=("tier",))
    for tier in CACHED_TIERS:
        count.add_metric((tier.name,), counts.get(tier, 0))
        size.add_metric((tier.name,), sizes.get(tier, 0))
    yield count
    yield size


class ReleaseCollector(Collector):
    """Per-revision counters of the revisions under release, keyed by the revision (never only
    the alias): ``loraplex_release_requests_total{adapter, revision, role, outcome}``,
    ``loraplex_release_feedback_total{adapter, revision, rating}`` and
    ``loraplex_release_state{adapter, revision, state}`` (1 on the candidate's release state).
    A revision's series go when its release ends (cardinality: two revisions per active
    release, at most ``ReleaseTraffic``'s ``max_tracked``)."""

    def __init__(self, traffic: ReleaseTraffic) -> None:
        self._traffic = traffic

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "loraplex_release_requests",
            "Finished requests of revisions under release (excluded ones not counted).",
            labels=("adapter", "revision", "role", "outcome"),
        )
        feedback = CounterMetricFamily(
            "loraplex_release_feedback",
            "Client ratings (POST /v1/feedback) of revisions under release.",
            labels=("adapter", "revision", "rating"),
        )
        state = GaugeMetricFamily(
            "loraplex_release_state",
            "1 on the state of the release whose candidate is this revision.",
            labels=("adapter", "revision", "state"),
        )
        for tracked, totals in self._traffic.totals():
            who = (tracked.adapter, tracked.revision)
            requests.add_metric((*who, tracked.role, "ok"), totals.ok)
            requests.add_metric((*who, tracked.role, "error"), totals.error)
            feedback.add_metric((*who, "good"), totals.good)
            feedback.add_metric((*who, "bad"), totals.bad)
            if tracked.role == CANDIDATE:
                state.add_metric((*who, tracked.state), 1)
        transitions = CounterMetricFamily(
            "loraplex_release_transitions",
            "Releases moved into each state (rolled_back: rollbacks), controller and operator.",
            labels=("state",),
        )
        # every state from 0: a series born at 1 hides its first increase from increase()
        moved = {state.value: 0 for state in ReleaseState} | self._traffic.transitions()
        for to, count in sorted(moved.items()):
            transitions.add_metric((to,), count)
        yield requests
        yield feedback
        yield state
        yield transitions
