"""A hostile tenant sending a sampled W3C ``traceparent`` on every request must not fill the
shared span export queue: its forced traces take at most its share (``parent_burst_spans``, then
``parent_spans_per_s``); beyond it its requests are sampled as anyone's (the ratio), counted in
``loraplex_trace_parent_refused_total``, and other tenants' sampled traces are still kept. Nor
may one making cheap failures (404s): its error traces take at most its error share, the rest
counted in ``loraplex_trace_errors_dropped_total``, and other tenants' traces are still kept. Nor
may one making deliberately slow requests (long ``max_tokens``, slow reading): its slow traces
take at most its slow share, the rest counted in ``loraplex_trace_slow_dropped_total``.

On the fake engine with the real app; the tracer hands its spans to a collecting processor and
its clock stands still (no refill), so the share is exact."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from conftest import ADMIN_KEY, Served, make_app_deps
from fakes import FakeEngine
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from prometheus_client.parser import text_string_to_metric_families

from loraplex.server.app import create_app
from loraplex.server.deps import ServerDeps
from loraplex.tracing.config import TracingConfig
from loraplex.tracing.exporter import Tracer

SECRET = b"0123456789abcdef0123456789abcdef"
BURST_SPANS = 12  # about three traces of the fake engine (root, authorization, resolution, engine)


class Collected(SpanProcessor):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)

    def roots(self, tenant: str) -> list[ReadableSpan]:
        return [
            s
            for s in self.spans
            if s.kind.name == "SERVER" and (s.attributes or {}).get("loraplex.tenant") == tenant
        ]


@dataclass
class Traced:
    client: TestClient
    served: Served
    collected: Collected
    tracer: Tracer

    def post(self, tenant: str, traceparent: str | None, model: str = "support") -> int:
        headers = {"Authorization": f"Bearer {self.served.keys[tenant]}"}
        if traceparent is not None:
            headers["traceparent"] = traceparent
        body = {"model": model, "prompt": "hi", "max_tokens": 2}
        return self.client.post("/v1/completions", json=body, headers=headers).status_code


@pytest.fixture
def traced(served: Served) -> Iterator[Traced]:
    collected = Collected()
    config = TracingConfig(
        "http://127.0.0.1:9/v1/traces", SECRET, sample_ratio=0.0, export_names=True,
        parent_burst_spans=BURST_SPANS, parent_spans_per_s=1.0,
    )  # fmt: skip
    tracer = Tracer(
        config, "base", rng=random.Random(5), processor=collected, clock_s=lambda: 100.0
    )
    plain = make_app_deps(served, FakeEngine())
    deps = ServerDeps(
        plain.config, plain.engine, plain.registry, plain.cache, plain.chat,
        refresh_tenants=plain.refresh_tenants, fleet=plain.fleet, tracing=tracer,
    )  # fmt: skip
    with TestClient(create_app(deps)) as client:
        yield Traced(client, served, collected, tracer)
    assert deps.cache is not None
    deps.cache.close()


def _sampled(i: int) -> str:
    return f"00-{i + 1:032x}-{i + 1:016x}-01"


def _refused(traced: Traced, name: str = "loraplex_trace_parent_refused") -> dict[str, float]:
    text = traced.client.get("/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == name:
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[sample.labels["priority_class"]] = sample.value
    return out


def test_a_tenant_forcing_sampling_on_every_request_gets_only_its_share(traced: Traced) -> None:
    assert _refused(traced) == {"high": 0.0, "normal": 0.0, "batch": 0.0}  # born at 0
    for i in range(10):
        assert traced.post("acme", _sampled(i)) == 200
    kept = traced.collected.roots("acme")
    acme_spans = {s.context.trace_id for s in kept}
    num_spans = sum(1 for s in traced.collected.spans if s.context.trace_id in acme_spans)
    assert 1 <= len(kept) < 10
    # the share, plus the one trace that was let in with some of it left
    assert num_spans < BURST_SPANS + num_spans / len(kept)
    assert {s.attributes["loraplex.trace.kept_by"] for s in kept} == {"parent"}  # type: ignore[index]
    refused = _refused(traced)
    assert sum(refused.values()) == 10 - len(kept)
    # another tenant's sampled request is still traced under its caller's span
    assert traced.post("globex", _sampled(99), model="search") == 200
    (globex,) = traced.collected.roots("globex")
    assert globex.parent is not None and globex.parent.span_id == 100
    assert (globex.attributes or {})["loraplex.trace.kept_by"] == "parent"


def test_a_refused_request_still_gets_the_ratio_and_errors_are_kept(served: Served) -> None:
    """Past its share a tenant's sampled request is decided as an unsampled one: dropped at ratio
    0, kept when it fails; its answer is the same either way."""
    collected = Collected()
    config = TracingConfig(
        "http://127.0.0.1:9/v1/traces", SECRET, sample_ratio=0.0, export_names=True,
        parent_burst_spans=1, parent_spans_per_s=1.0,
    )  # fmt: skip
    now = [0.0]
    tracer = Tracer(config, "base", processor=collected, clock_s=lambda: now[0])
    plain = make_app_deps(served, FakeEngine())
    deps = ServerDeps(
        plain.config, plain.engine, plain.registry, plain.cache, plain.chat,
        refresh_tenants=plain.refresh_tenants, fleet=plain.fleet, tracing=tracer,
    )  # fmt: skip
    with TestClient(create_app(deps)) as client:
        traced = Traced(client, served, collected, tracer)
        assert traced.post("acme", _sampled(0)) == 200  # takes the whole share
        assert traced.post("acme", _sampled(1)) == 200  # refused: ratio 0 drops it
        assert traced.post("acme", _sampled(2), model="no-such-adapter") == 404  # kept: error
        reasons = [(r.attributes or {})["loraplex.trace.kept_by"] for r in collected.roots("acme")]
        assert reasons == ["parent", "error"]
        now[0] += 60.0  # the share refills
        assert traced.post("acme", _sampled(3)) == 200
        assert len(collected.roots("acme")) == 3
    assert deps.cache is not None
    deps.cache.close()


class Bounded(Collected):
    """A queue that drops *new* spans once it holds ``capacity`` (as ``BatchSpanProcessor``
    does while its exporter lags): what one tenant fills, others lose."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def on_end(self, span: ReadableSpan) -> None:
        if len(self.spans) < self.capacity:
            self.spans.append(span)


@contextmanager
def _bounded(
    served: Served, capacity: int = 48, ratio: float = 0.0, **share: float
) -> Iterator[Traced]:
    """The app tracing into a ``Bounded`` queue of ``capacity`` spans at ``ratio``, its clock
    still (no refill), with the tracer settings ``share``."""
    collected = Bounded(capacity)
    config = TracingConfig(
        "http://127.0.0.1:9/v1/traces", SECRET, sample_ratio=ratio, export_names=True, **share
    )  # type: ignore[arg-type]
    tracer = Tracer(config, "base", processor=collected, clock_s=lambda: 100.0)
    plain = make_app_deps(served, FakeEngine())
    deps = ServerDeps(
        plain.config, plain.engine, plain.registry, plain.cache, plain.chat,
        refresh_tenants=plain.refresh_tenants, fleet=plain.fleet, tracing=tracer,
    )  # fmt: skip
    with TestClient(create_app(deps)) as client:
        yield Traced(client, served, collected, tracer)
    assert deps.cache is not None
    deps.cache.close()


def _flood(traced: Traced, model: str, status: int, counter: str) -> dict[str, float]:
    """40 requests of acme for ``model``: its traces stop at its share (``BURST_SPANS``), each
    one it lost counted in ``counter`` (every class from 0); returns that counter."""
    assert _refused(traced, counter) == {"high": 0.0, "normal": 0.0, "batch": 0.0}
    for _ in range(40):
        assert traced.post("acme", None, model=model) == status
    kept = traced.collected.roots("acme")
    assert 1 <= len(kept) < 40
    acme_ids = {s.context.trace_id for s in kept}
    num_spans = sum(1 for s in traced.collected.spans if s.context.trace_id in acme_ids)
    assert num_spans < BURST_SPANS + num_spans / len(kept)  # the share and one trace
    dropped = _refused(traced, counter)
    assert sum(dropped.values()) == 40 - len(kept)
    return dropped


def _reasons(traced: Traced, tenant: str) -> list[str]:
    return [(r.attributes or {})["loraplex.trace.kept_by"] for r in traced.collected.roots(tenant)]


def test_a_tenant_flooding_cheap_failures_gets_only_its_error_share(served: Served) -> None:
    """40 404s of one tenant (about 80 spans) against a 48-span queue: before its error share,
    they filled it and the other tenant's failure and sampled request were dropped; now its
    error traces stop at the share, the rest are counted, and the other tenant's are kept."""
    with _bounded(served, error_burst_spans=BURST_SPANS, error_spans_per_s=1.0) as traced:
        dropped = _flood(traced, "no-such-adapter", 404, "loraplex_trace_errors_dropped")
        assert traced.post("globex", None, model="no-such-adapter") == 404
        assert traced.post("globex", _sampled(7), model="search") == 200
        assert _reasons(traced, "globex") == ["error", "parent"]
        # the other tenant's failure was not dropped
        assert _refused(traced, "loraplex_trace_errors_dropped") == dropped


def test_a_tenant_making_slow_requests_gets_only_its_slow_share(served: Served) -> None:
    """40 slow requests of one tenant (``slow_s`` tiny: every request is slow; in production a
    long ``max_tokens`` or a stream read slowly) against a 48-span queue: before its slow share
    they filled it and the other tenant's slow request was dropped; now its slow traces stop at
    the share, the rest are counted, and the other tenant's is kept."""
    share = {"slow_s": 1e-9, "slow_burst_spans": BURST_SPANS, "slow_spans_per_s": 1.0}
    with _bounded(served, **share) as traced:
        dropped = _flood(traced, "support", 200, "loraplex_trace_slow_dropped")
        assert set(_reasons(traced, "acme")) == {"slow"}
        assert traced.post("globex", None, model="search") == 200
        assert _reasons(traced, "globex") == ["slow"]
        # a slow failure past the slow share is still kept within the error share, uncounted
        assert traced.post("acme", None, model="no-such-adapter") == 404
        assert _reasons(traced, "acme")[-1] == "error"
        assert _refused(traced, "loraplex_trace_slow_dropped") == dropped


def test_the_share_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="parent_burst_spans 0 is invalid"):
        TracingConfig("http://c:4318/v1/traces", SECRET, parent_burst_spans=0)
    with pytest.raises(ValueError, match="parent_spans_per_s -1 is invalid"):
        TracingConfig("http://c:4318/v1/traces", SECRET, parent_spans_per_s=-1)
    with pytest.raises(ValueError, match="error_burst_spans 0 is invalid"):
        TracingConfig("http://c:4318/v1/traces", SECRET, error_burst_spans=0)
    with pytest.raises(ValueError, match="error_spans_per_s 0 is invalid"):
        TracingConfig("http://c:4318/v1/traces", SECRET, error_spans_per_s=0)
    with pytest.raises(ValueError, match="slow_burst_spans 0 is invalid"):
        TracingConfig("http://c:4318/v1/traces", SECRET, slow_burst_spans=0)
    with pytest.raises(ValueError, match="slow_spans_per_s 0 is invalid"):
        TracingConfig("http://c:4318/v1/traces", SECRET, slow_spans_per_s=0)


def test_a_tenant_forcing_every_kind_gets_only_its_whole_share(served: Served) -> None:
    """Every acme request slow (``slow_s`` tiny) and flagged, half of them failing: before its
    share over all kinds, it took its slow, its flag and its error share, 36 spans of a 40-span
    queue, and another tenant's failure and slow request no longer fit; now the three kinds
    together stop at its whole share (and one trace), every refusal is counted by its kind, and
    the other tenant's traces are kept."""
    share = {
        "slow_s": 1e-9, "tenant_burst_spans": BURST_SPANS, "tenant_spans_per_s": 1.0,
        "slow_burst_spans": BURST_SPANS, "error_burst_spans": BURST_SPANS,
        "parent_burst_spans": BURST_SPANS,
    }  # fmt: skip
    with _bounded(served, capacity=40, **share) as traced:
        for i in range(10):
            assert traced.post("acme", _sampled(i)) == 200
            assert traced.post("acme", _sampled(50 + i), model="no-such-adapter") == 404
        kept = traced.collected.roots("acme")
        acme_ids = {s.context.trace_id for s in kept}
        num_spans = sum(1 for s in traced.collected.spans if s.context.trace_id in acme_ids)
        assert kept and num_spans < BURST_SPANS + 4  # the share and one trace
        errors = _refused(traced, "loraplex_trace_errors_dropped")
        slow = _refused(traced, "loraplex_trace_slow_dropped")
        flags = _refused(traced, "loraplex_trace_parent_refused")
        assert sum(errors.values()) == 10 - _reasons(traced, "acme").count("error")
        assert sum(slow.values()) == 20 - len(kept)  # every request was slow
        assert sum(flags.values()) == 20 - len(kept)  # and flagged
        assert traced.post("globex", None, model="no-such-adapter") == 404
        assert traced.post("globex", None, model="search") == 200
        assert _reasons(traced, "globex") == ["error", "slow"]


def test_the_tenant_share_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="tenant_burst_spans 0 is invalid"):
        TracingConfig("http://c:4318/v1/traces", SECRET, tenant_burst_spans=0)
    with pytest.raises(ValueError, match="tenant_spans_per_s 0 is invalid"):
        TracingConfig("http://c:4318/v1/traces", SECRET, tenant_spans_per_s=0)


def _low_bits_zero(i: int) -> str:
    """An unsampled ``traceparent`` whose trace id any ratio above 0 would keep if it decided on
    the id as sent (its low 64 bits are 0)."""
    return f"00-{i + 1:016x}{0:016x}-{i + 1:016x}-00"


def test_a_tenant_choosing_its_trace_ids_gets_the_ratio_like_anyone(served: Served) -> None:
    """The ratio decided on the trace id, which a caller's ``traceparent`` chooses: 40 acme
    requests without the sampled flag, with trace ids whose low 64 bits are 0, were all kept at
    the default ratio 0.01 (charged to no share) and filled a 48-span queue, so globex's sampled
    request was dropped. Now a caller's trace id is keyed-hashed before the ratio sees it."""
    with _bounded(served, ratio=0.01) as traced:
        for i in range(40):
            assert traced.post("acme", _low_bits_zero(i)) == 200
        assert len(traced.collected.roots("acme")) <= 2  # about 0.4 expected
        assert traced.post("globex", _sampled(7), model="search") == 200
        assert _reasons(traced, "globex") == ["parent"]
