"""A kept trace whose spans cannot be built is lost before any span is made, so neither
``loraplex_trace_spans_exported_total`` nor ``..._spans_dropped_total`` sees it: it was only
logged. ``loraplex_trace_build_failed_total`` counts it, one per trace, and the request and the
traces after it are unaffected."""

from __future__ import annotations

import logging
import random

import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from loraplex.engine.protocol import TokenDelta
from loraplex.server.metrics_traces import TraceCollector
from loraplex.tracing.config import TracingConfig
from loraplex.tracing.exporter import Tracer
from loraplex.tracing.record import Subject

SECRET = b"0123456789abcdef0123456789abcdef"
SUBJECT = Subject("chat", "support", "acme", "standard")


class Collected(SpanProcessor):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


def _build_failed(tracer: Tracer) -> float:
    registry = CollectorRegistry()
    registry.register(TraceCollector(tracer))
    text = generate_latest(registry).decode()
    samples = [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "loraplex_trace_build_failed_total"
    ]
    assert len(samples) == 1, text
    return samples[0]


def _traced_request(tracer: Tracer, prompt_tokens: object) -> None:
    trace = tracer.begin(None, SUBJECT, None)
    sibling = trace.submit("r1")
    sibling.on_delta(TokenDelta((5,), "x", "stop", 3, 1), 0)
    sibling.input_tokens = prompt_tokens  # type: ignore[assignment]
    trace.sibling_ended(sibling, "stop", None, None)


def test_a_trace_that_cannot_be_built_is_counted(caplog: pytest.LogCaptureFixture) -> None:
    collected = Collected()
    config = TracingConfig("http://127.0.0.1:4318/v1/traces", SECRET, sample_ratio=1.0)
    tracer = Tracer(config, "base", rng=random.Random(7), processor=collected)
    assert _build_failed(tracer) == 0  # present from 0 while tracing is on

    with caplog.at_level(logging.ERROR, logger="loraplex.tracing.exporter"):
        _traced_request(tracer, "3")  # a record no span can be built from: str + int
    assert "could not be built; dropped" in caplog.text
    assert collected.spans == [] and tracer.num_kept == 0
    assert _build_failed(tracer) == 1

    _traced_request(tracer, 3)  # the next trace is built and handed on as before
    assert tracer.num_kept == 1 and collected.spans
    assert _build_failed(tracer) == 1
