"""No span is lost without a count: every span of a kept trace either reaches the OTLP receiver
(``loraplex_trace_spans_exported_total``) or is counted in
``loraplex_trace_spans_dropped_total{reason}`` on ``/metrics``: a full export queue, a dead
receiver, a server shut down. Before, the SDK only wrote a line to stderr.

On the fake engine with the real app, exporting to a real OTLP receiver (``otlp_receiver.py``);
every request is traced (ratio 1), so the tracer makes ``num_spans`` spans and the counters must
add up to them exactly: made = received + dropped."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

from conftest import ADMIN_KEY, Served, make_app_deps
from fakes import FakeEngine
from fastapi.testclient import TestClient
from otlp_receiver import OtlpReceiver
from prometheus_client.parser import text_string_to_metric_families

from loraplex.server.app import create_app
from loraplex.server.deps import ServerDeps
from loraplex.tracing.config import TracingConfig
from loraplex.tracing.exporter import Tracer

SECRET = b"0123456789abcdef0123456789abcdef"
NUM_REQUESTS = 12


@contextmanager
def _server(served: Served, tracer: Tracer) -> Iterator[TestClient]:
    plain = make_app_deps(served, FakeEngine())
    deps = ServerDeps(
        plain.config, plain.engine, plain.registry, plain.cache, plain.chat,
        refresh_tenants=plain.refresh_tenants, fleet=plain.fleet, tracing=tracer,
    )  # fmt: skip
    try:
        with TestClient(create_app(deps)) as client:
            yield client
    finally:
        tracer.shutdown()
        assert deps.cache is not None
        deps.cache.close()


def _tracer(endpoint: str, max_queue_spans: int = 8192, timeout_s: float = 30.0) -> Tracer:
    config = TracingConfig(
        endpoint, SECRET, sample_ratio=1.0, max_queue_spans=max_queue_spans,
        export_timeout_s=timeout_s,
    )  # fmt: skip
    return Tracer(config, "base")


def _post(client: TestClient, served: Served, num: int = NUM_REQUESTS) -> None:
    headers = {"Authorization": f"Bearer {served.keys['acme']}"}
    body = {"model": "support", "prompt": "hi", "max_tokens": 2}
    for _ in range(num):
        assert client.post("/v1/completions", json=body, headers=headers).status_code == 200


def _span_counts(client: TestClient) -> tuple[float, dict[str, float]]:
    """(exported, dropped by reason) as ``/metrics`` shows them."""
    text = client.get("/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).text
    exported, dropped = -1.0, {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "loraplex_trace_spans_exported_total":
                exported = sample.value
            if sample.name == "loraplex_trace_spans_dropped_total":
                dropped[sample.labels["reason"]] = sample.value
    return exported, dropped


def _dead_endpoint() -> str:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1/traces"


def test_every_span_reaches_a_live_receiver(served: Served) -> None:
    with OtlpReceiver() as receiver:
        tracer = _tracer(receiver.url)
        with _server(served, tracer) as client:
            _post(client, served)
            assert tracer.flush(30.0)
            exported, dropped = _span_counts(client)
        assert tracer.num_spans > NUM_REQUESTS
        assert len(receiver.snapshot()) == exported == tracer.num_spans
        assert dropped == {"queue_full": 0, "export_failed": 0, "shutdown": 0}


def test_a_full_queue_drops_new_spans_and_counts_them(served: Served) -> None:
    """An 8-span queue while the receiver does not answer yet: the exporter's first POST waits
    (the receiver's socket listens, nobody reads), so at most 8 spans are in that POST and 8
    more wait; the rest are refused and counted."""
    receiver = OtlpReceiver()  # bound, not serving until entered
    tracer = _tracer(receiver.url, max_queue_spans=8)
    with _server(served, tracer) as client:
        _post(client, served)
        with receiver:
            assert tracer.flush(30.0)
            exported, dropped = _span_counts(client)
            received = len(receiver.snapshot())
    assert tracer.num_spans > 16
    assert dropped["queue_full"] >= tracer.num_spans - 16
    assert dropped["export_failed"] == dropped["shutdown"] == 0
    assert exported == received == tracer.num_spans - dropped["queue_full"]
    assert received > 0


def test_a_dead_receiver_costs_counted_spans(served: Served) -> None:
    tracer = _tracer(_dead_endpoint(), timeout_s=0.5)
    with _server(served, tracer) as client:
        _post(client, served, num=3)
        tracer.flush(30.0)
        exported, dropped = _span_counts(client)
    assert exported == 0 and tracer.num_spans > 3
    assert dropped == {"queue_full": 0, "export_failed": tracer.num_spans, "shutdown": 0}


def test_spans_after_shutdown_are_counted(served: Served) -> None:
    with OtlpReceiver() as receiver:
        tracer = _tracer(receiver.url)
        with _server(served, tracer) as client:
            _post(client, served, num=2)
            before = tracer.num_spans
            tracer.shutdown()  # exports what is queued
            _post(client, served, num=2)
            exported, dropped = _span_counts(client)
        assert len(receiver.snapshot()) == exported == before
        assert dropped["shutdown"] == tracer.num_spans - before > 0
