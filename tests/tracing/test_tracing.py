"""The tracing package alone: W3C context parsing, the ratio, keyed names, the tail sampling
decision (errors and slow requests always kept), the settings' validation, and the engine's
bounded per-request log."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from loraplex.engine.protocol import TokenDelta
from loraplex.engine.trace_log import MAX_BATCH_RUNS, MAX_MODE_TRANSITIONS, TraceLog
from loraplex.residency.ledger import Tier
from loraplex.serve.config import ServeConfig
from loraplex.serve.tracing import build_tracer, trace_secret
from loraplex.tracing.config import TracingConfig
from loraplex.tracing.context import parse_traceparent, ratio_keeps, root_ids
from loraplex.tracing.exporter import Tracer
from loraplex.tracing.names import NameMasker
from loraplex.tracing.record import Subject

SECRET = b"0123456789abcdef0123456789abcdef"
URL = "http://127.0.0.1:4318/v1/traces"


class Collected(SpanProcessor):
    """Keeps what the tracer hands its processor (the OTLP path is tested end to end)."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


class Clock:
    def __init__(self) -> None:
        self.ns = 1_000_000_000

    def __call__(self) -> int:
        return self.ns


def _tracer(ratio: float, slow_s: float | None = 10.0) -> tuple[Tracer, Collected, Clock]:
    collected, clock = Collected(), Clock()
    config = TracingConfig(URL, SECRET, sample_ratio=ratio, slow_s=slow_s)
    tracer = Tracer(config, "base", rng=random.Random(7), now_ns=clock, processor=collected)
    return tracer, collected, clock


SUBJECT = Subject("chat", "support", "acme", "standard")


def test_traceparent_parsing() -> None:
    trace, span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    assert parse_traceparent(f"00-{trace}-{span}-01") == (int(trace, 16), int(span, 16), True)
    assert parse_traceparent(f"00-{trace}-{span}-00") == (int(trace, 16), int(span, 16), False)
    for bad in (
        None,
        "",
        f"ff-{trace}-{span}-01",  # version ff is invalid
        f"00-{'0' * 32}-{span}-01",  # all-zero trace id
        f"00-{trace}-{'0' * 16}-01",
        f"00-{trace}-{span}-01" + "x" * 100,
        "00-zz-not-a-trace-01",
    ):
        assert parse_traceparent(bad) is None, bad
    ids = root_ids(f"00-{trace}-{span}-01", random.Random(1))
    expected = (int(trace, 16), int(span, 16), True)
    assert (ids.trace_id, ids.parent_id, ids.parent_sampled) == expected
    assert ids.traceparent().startswith(f"00-{trace}-")
    fresh = root_ids("garbage", random.Random(1))
    assert fresh.parent_id is None and fresh.trace_id != 0


def test_the_ratio_decides_on_the_trace_id() -> None:
    rng = random.Random(3)
    ids = [rng.getrandbits(128) for _ in range(4000)]
    assert not any(ratio_keeps(t, 0.0) for t in ids)
    assert all(ratio_keeps(t, 1.0) for t in ids)
    kept = sum(ratio_keeps(t, 0.25) for t in ids)
    assert 800 < kept < 1200
    assert [ratio_keeps(t, 0.25) for t in ids] == [ratio_keeps(t, 0.25) for t in ids]


def test_the_ratio_decides_on_a_keyed_hash_of_a_callers_trace_id() -> None:
    """A caller's ``traceparent`` chooses its trace id: one whose low 64 bits are 0 was kept at
    any ratio above 0. The ratio now sees a caller's trace id keyed-hashed (the server's own ids
    are random already), so a caller's choice keeps the ratio's share of its requests."""
    tracer, collected, clock = _tracer(0.25)
    for i in range(400):
        trace = tracer.begin(f"00-{i + 1:016x}{0:016x}-{i + 1:016x}-00", SUBJECT, None)
        assert trace.ids.parent_id is not None  # the caller's id was taken
        sibling = trace.submit(f"r{i}")
        sibling.on_delta(TokenDelta((5,), "x", "stop", 3, 1), clock.ns)
        trace.sibling_ended(sibling, "stop", None, None)
    assert 60 < tracer.num_kept < 140  # 100 expected; all 400 before
    assert tracer.num_kept + tracer.num_dropped == 400
    assert collected.spans


def test_names_are_keyed_hashes_unless_allowed() -> None:
    masked = NameMasker(SECRET, export_names=False)
    assert masked("acme") == masked("acme") != masked("globex")
    assert masked("acme").startswith("h:") and "acme" not in masked("acme")
    assert NameMasker(b"another-secret-0123456789", False)("acme") != masked("acme")
    assert NameMasker(SECRET, export_names=True)("acme") == "acme"


def test_ratio_zero_keeps_errors_and_slow_requests_only() -> None:
    tracer, collected, clock = _tracer(0.0, slow_s=2.0)
    quick = tracer.begin(None, SUBJECT, None)
    sibling = quick.submit("r1")
    sibling.on_delta(TokenDelta((5,), "x", "stop", 3, 1), clock.ns)
    quick.sibling_ended(sibling, "stop", None, None)
    assert tracer.num_dropped == 1 and not collected.spans

    failed = tracer.begin(None, SUBJECT, None)
    failed.failed(LookupError("no such adapter"))
    assert tracer.kept_by(failed) == "error"
    roots = [s for s in collected.spans if s.parent is None]
    assert len(roots) == 1 and roots[0].attributes["error.type"] == "LookupError"

    slow = tracer.begin(None, SUBJECT, None)
    sibling = slow.submit("r2")
    clock.ns += 2_500_000_000
    slow.sibling_ended(sibling, "length", None, "ok")
    assert tracer.kept_by(slow) == "slow"
    assert tracer.num_kept == 2


def test_a_trace_ends_when_its_last_sibling_does() -> None:
    tracer, collected, _ = _tracer(1.0)
    trace = tracer.begin(None, SUBJECT, None)
    first, second = trace.submit("a"), trace.submit("b")
    trace.sibling_ended(first, "stop", None, None)
    assert not collected.spans
    trace.sibling_ended(second, "error", None, None)  # no last delta: an error
    engines = [s for s in collected.spans if s.name == "loraplex.engine"]
    assert len(engines) == 2
    assert {s.attributes.get("error.type") for s in engines} == {None, "StreamEnded"}


def test_settings_are_validated_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="trace_endpoint"):
        TracingConfig("collector:4318", SECRET)
    with pytest.raises(ValueError, match="trace_sample_ratio"):
        TracingConfig(URL, SECRET, sample_ratio=1.5)
    with pytest.raises(ValueError, match="trace secret"):
        TracingConfig(URL, b"short")
    with pytest.raises(ValueError, match="trace_slow_s"):
        ServeConfig(data_dir=tmp_path, trace_slow_s=0)
    with pytest.raises(ValueError, match="trace_sample_ratio"):
        ServeConfig(data_dir=tmp_path, trace_sample_ratio=-0.1)
    with pytest.raises(ValueError, match="trace_endpoint"):
        ServeConfig(data_dir=tmp_path, trace_endpoint="ftp://x/v1/traces")
    assert build_tracer(ServeConfig(data_dir=tmp_path), "base") is None  # off by default


def test_the_trace_secret_is_made_once_and_private(tmp_path: Path) -> None:
    secret = trace_secret(tmp_path)
    assert len(secret) == 32 and trace_secret(tmp_path) == secret
    assert (tmp_path / "trace-secret").stat().st_mode & 0o077 == 0


def test_the_engine_log_keeps_batch_runs_bounded() -> None:
    log = TraceLog(arrival_s=100.0)
    log.defer(100.5)
    log.leased(101.0, Tier.L2, {"read": 0.3, "copy": 0.1}, 0.05)
    for step in range(5):  # five same-shaped steps: one run
        log.batch(101.0 + step, 4, 2, "grouped")
    for step in range(2 * MAX_BATCH_RUNS):  # every step a new shape
        log.batch(110.0 + step, 1 + step % 2, 1, "masked")
    trace = log.finish(200.0, queue_s=1.0, base=False)
    assert trace.batches[0].num_steps == 5 and trace.batches[0].batch_size == 4
    assert len(trace.batches) == MAX_BATCH_RUNS
    assert trace.num_steps_dropped == 2 * MAX_BATCH_RUNS - (MAX_BATCH_RUNS - 1)  # counted
    assert trace.deferred_s == pytest.approx(0.5) and trace.leased_offset_s == pytest.approx(1.0)
    assert trace.placement == "loaded" and trace.adapter_tier is Tier.L2
    assert trace.load_stages == (("read", 0.3), ("copy", 0.1))
    assert TraceLog(0.0).finish(1.0, None, base=True).placement == "base"


def test_an_endpoint_without_the_otel_extra_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # None in sys.modules makes the import raise ImportError, as without the extra installed.
    monkeypatch.setitem(sys.modules, "loraplex.tracing.exporter", None)
    config = ServeConfig(data_dir=tmp_path, trace_endpoint=URL)
    with pytest.raises(ValueError, match=r"trace_endpoint .*loraplex\[otel\]"):
        build_tracer(config, "base")


def test_the_engine_log_keeps_mode_transitions_bounded() -> None:
    log = TraceLog(arrival_s=100.0)
    log.mode_transition(102.0, 0.5, "merge", "acme/bot@v1")
    for step in range(2 * MAX_MODE_TRANSITIONS):
        log.mode_transition(110.0 + step, 0.1, "unmerge", "acme/bot@v1")
    marks = log.finish(200.0, queue_s=1.0, base=False).mode_transitions
    assert len(marks) == MAX_MODE_TRANSITIONS
    assert marks[0].start_offset_s == pytest.approx(1.5) and marks[0].seconds == 0.5
    assert (marks[0].direction, marks[1].direction) == ("merge", "unmerge")
    assert TraceLog(0.0).finish(1.0, None, base=True).mode_transitions == ()
