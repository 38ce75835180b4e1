"""The engine's mode report: transitions land in the right bucket, cumulatively for Prometheus,
per direction; an unknown direction is refused naming it."""

from __future__ import annotations

import pytest

from loraplex.engine.mode_report import TRANSITION_BUCKETS_S, ModeReport, TransitionHistogram


def test_observations_fill_buckets_cumulatively() -> None:
    histogram = TransitionHistogram().observe(0.003).observe(0.003).observe(0.2).observe(99.0)
    buckets = dict(histogram.cumulative())
    assert buckets["0.0025"] == 0 and buckets["0.005"] == 2
    assert buckets["0.1"] == 2 and buckets["0.25"] == 3
    assert buckets["10.0"] == 3 and buckets["+Inf"] == 4
    assert len(buckets) == len(TRANSITION_BUCKETS_S) + 1
    assert histogram.num_observed == 4
    assert histogram.sum_s == pytest.approx(99.206)
    assert dict(TransitionHistogram().observe(0.005).cumulative())["0.005"] == 1  # le: inclusive


def test_a_report_counts_each_direction_and_tracks_the_merged_revision() -> None:
    report = ModeReport("auto", None).observed("merge", 0.01, "acme/bot@v1")
    assert report.merged_revision == "acme/bot@v1"
    report = report.observed("unmerge", 0.002, None)
    assert (report.merge.num_observed, report.unmerge.num_observed) == (1, 1)
    assert report.merged_revision is None and report.setting == "auto"
    with pytest.raises(ValueError, match="direction 'sideways' is invalid"):
        report.observed("sideways", 0.1, None)


def test_the_measured_lora_cost_survives_transitions_and_reaches_metrics() -> None:
    from types import SimpleNamespace
    from typing import cast

    from prometheus_client import CollectorRegistry, generate_latest

    from loraplex.engine.protocol import EngineClient
    from loraplex.server.metrics_modes import ModeCollector

    report = ModeReport("auto", None, lora_s_per_token=2.5e-5).observed("merge", 0.01, "a/b@c")
    assert report.lora_s_per_token == 2.5e-5  # a transition keeps every field
    reports = [ModeReport("auto", None), report]
    engine = SimpleNamespace(load_snapshot=lambda: SimpleNamespace(mode=reports[0]))
    registry = CollectorRegistry()
    registry.register(ModeCollector(cast(EngineClient, engine)))
    assert b"loraplex_mode_lora_seconds_per_token" not in generate_latest(registry)  # unmeasured
    reports.pop(0)
    assert b"loraplex_mode_lora_seconds_per_token 2.5e-05" in generate_latest(registry)
