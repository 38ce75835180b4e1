"""``loraplex_mode_transition_seconds{direction}``: the engine's measured merge and unmerge stalls
(what the steps waited; docs/modes.md), ``loraplex_mode_staging_seconds`` (a merge's staging
work before its commit), ``loraplex_mode_staging`` (1 while one is staged),
``loraplex_mode_merged`` (1 while a revision is in its base weights) and, once
``auto`` has measured it, ``loraplex_mode_lora_seconds_per_token`` (the unmerged LoRA op's cost
per adapter token, the figure ``auto`` weighs merging with).

Read at scrape time from the engine's published report (``EngineLoad.mode``, cumulative: it
crosses the engine-process pipe with the queue view), so a scrape never waits on the engine. An
engine in ``unmerged`` mode reports nothing, and neither family appears.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from loraplex.engine.protocol import EngineClient
from loraplex.errors import EngineUnavailableError


class ModeCollector(Collector):
    """The execution mode's families from ``engine.load_snapshot().mode`` at scrape time."""

    def __init__(self, engine: EngineClient) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        try:
            report = self._engine.load_snapshot().mode
        except EngineUnavailableError:  # down: its counts are gone with it
            return
        if report is None:
            return
        family = HistogramMetricFamily(
            "loraplex_mode_transition_seconds",
            "Seconds the steps waited for one merge or unmerge of an adapter into the base "
            "weights (a merge's commit; its staging is loraplex_mode_staging_seconds).",
            labels=("direction",),
        )
        for direction, histogram in (("merge", report.merge), ("unmerge", report.unmerge)):
            family.add_metric([direction], histogram.cumulative(), histogram.sum_s)
        yield family
        staging = HistogramMetricFamily(
            "loraplex_mode_staging_seconds",
            "Seconds of work one merge spent building its merged weights beside the live ones, "
            "spread over step boundaries, before the commit the steps waited for.",
        )
        staging.add_metric([], report.staging.cumulative(), report.staging.sum_s)
        yield staging
        yield GaugeMetricFamily(
            "loraplex_mode_staging",
            "1 while a merge is being staged (the revision still served unmerged).",
            value=0 if report.staging_revision is None else 1,
        )
        yield GaugeMetricFamily(
            "loraplex_mode_merged",
            "1 while an adapter revision is merged into the engine's base weights.",
            value=0 if report.merged_revision is None else 1,
        )
        if report.lora_s_per_token is not None:
            yield GaugeMetricFamily(
                "loraplex_mode_lora_seconds_per_token",
                "Measured seconds of the unmerged LoRA op per adapter token (auto mode).",
                value=report.lora_s_per_token,
            )
