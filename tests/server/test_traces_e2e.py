"""Request traces end to end: ``loraplex serve`` (engine on a thread and in its own process)
exporting over OTLP/HTTP to a real receiver started here, which decodes the protobuf.

One server per engine mode, sampling ratio 0: a request whose caller sent a sampled W3C
``traceparent`` is traced (under the caller's span) with every stage; a plain successful request
is not exported; a failed one is, whatever the ratio. Names are keyed hashes by default.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from live import Live, live_server
from otlp_receiver import OtlpReceiver, ReceivedSpan

from loraplex.demo.assets import DemoAssets
from loraplex.serve.tracing import TRACE_SECRET_FILE
from loraplex.tracing.exporter import Tracer

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
# Every stage the issue names, as span names (load stages: at least one of them).
STAGES = {
    "loraplex.authorization",
    "loraplex.resolution",
    "loraplex.engine",
    "loraplex.queue",
    "loraplex.residency",
    "loraplex.batch",
}


@dataclass(frozen=True)
class Traced:
    live: Live  # the server
    receiver: OtlpReceiver  # where it exports
    data_dir: Path  # its data directory (holds the trace secret)


@pytest.fixture(scope="module", params=[False, True], ids=["engine-thread", "engine-process"])
def traced(
    request: pytest.FixtureRequest,
    demo_assets: DemoAssets,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Traced]:
    with OtlpReceiver() as receiver:
        data_dir = tmp_path_factory.mktemp("traced")
        with live_server(
            demo_assets, data_dir, max_loras=2, max_num_seqs=4, auto_warm=False,
            engine_process=request.param, trace_endpoint=receiver.url, trace_sample_ratio=0.0,
        ) as live:  # fmt: skip
            yield Traced(live, receiver, data_dir)


def _post(
    live: Live, tenant: str, headers: dict[str, str] | None = None, **body: object
) -> httpx.Response:
    # NOTE: greedy and past EOS, so every success has exactly max_tokens tokens: at the API's
    # default temperature (1.0) about one request in twenty stopped early (4 or 5 tokens).
    payload = {"model": "support", "prompt": "The acme support team", "max_tokens": 6,
               "temperature": 0, "ignore_eos": True}  # fmt: skip
    headers = {"Authorization": f"Bearer {live.key(tenant)}", **(headers or {})}
    return httpx.post(
        f"{live.url}/v1/completions", json={**payload, **body}, headers=headers, timeout=120
    )


def _flush(live: Live) -> None:
    tracer = live.server.deps.tracing
    assert isinstance(tracer, Tracer)
    assert tracer.flush(30.0)


def _hash(data_dir: Path, name: str) -> str:
    secret = bytes.fromhex((data_dir / TRACE_SECRET_FILE).read_text().strip())
    return "h:" + hmac.new(secret, name.encode(), hashlib.sha256).hexdigest()[:24]


def _by_name(spans: list[ReceivedSpan]) -> dict[str, list[ReceivedSpan]]:
    out: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        out.setdefault(span.name, []).append(span)
    return out


def test_a_sampled_caller_gets_every_stage_in_one_trace(
    traced: Traced,
) -> None:
    live, receiver = traced.live, traced.receiver
    parent = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
    reply = _post(live, "acme", {"traceparent": parent})
    assert reply.status_code == 200, reply.text
    _flush(live)
    spans = receiver.wait_for(lambda s: any(x.trace_id == CALLER_TRACE for x in s))
    mine = [s for s in spans if s.trace_id == CALLER_TRACE]
    names = _by_name(mine)
    assert names.keys() >= STAGES, sorted(names)
    assert any(n.startswith("loraplex.load.") for n in names), sorted(names)
    (root,) = [s for s in mine if s.parent_span_id == CALLER_SPAN]
    assert root.kind == 2  # SERVER
    ids = {s.span_id for s in mine}
    assert all(s.parent_span_id in ids for s in mine if s is not root)  # one tree
    data_dir = traced.data_dir
    attrs = root.attributes
    assert attrs["gen_ai.operation.name"] == "text_completion"
    assert attrs["gen_ai.request.model"] == _hash(data_dir, "support")
    assert attrs["gen_ai.response.model"] == _hash(data_dir, "acme/support@r1")
    assert attrs["loraplex.tenant"] == _hash(data_dir, "acme")
    assert attrs["gen_ai.usage.output_tokens"] == 6
    assert attrs["gen_ai.usage.input_tokens"] > 0
    assert attrs["loraplex.trace.kept_by"] == "parent"
    assert attrs["loraplex.release.verdict"] == "ok"
    assert root.name == f"text_completion {_hash(data_dir, 'support')}"
    values = " ".join(str(v) for s in mine for v in s.attributes.values())
    assert "acme" not in values and "support" not in values  # no private name leaks
    engine = names["loraplex.engine"][0]
    assert engine.attributes["loraplex.residency.placement"] == "loaded"
    assert engine.attributes["loraplex.adapter.tier"] in {"L1", "L2", "L3"}
    assert engine.attributes["loraplex.kv.prefix_reused_tokens"] == 0
    assert "loraplex.first_token" in engine.events
    batch = names["loraplex.batch"][0].attributes
    assert batch["loraplex.batch.size"] >= 1 and batch["loraplex.batch.revisions"] >= 1
    assert batch["loraplex.batch.kernel_strategy"] in {"masked", "grouped", "loop"}
    assert sum(b.attributes["loraplex.batch.steps"] for b in names["loraplex.batch"]) == 6
    for span in mine:
        assert root.start_ns <= span.start_ns <= span.end_ns <= root.end_ns + 1


def test_ratio_zero_exports_no_plain_success_but_every_error(
    traced: Traced,
) -> None:
    live, receiver = traced.live, traced.receiver
    before = {s.trace_id for s in receiver.snapshot()}
    assert _post(live, "acme").status_code == 200
    refused = _post(live, "acme", model="no-such-adapter")
    assert refused.status_code == 404
    _flush(live)
    spans = receiver.wait_for(lambda s: {x.trace_id for x in s} - before)
    new = [s for s in spans if s.trace_id not in before]
    roots = [s for s in new if s.kind == 2]
    assert len(roots) == 1  # the success was dropped by the ratio
    (root,) = roots
    assert root.status_code == 2  # ERROR
    assert root.attributes["loraplex.trace.kept_by"] == "error"
    assert root.attributes["error.type"] == "NotFoundError" or root.attributes["error.type"]
    assert "no-such-adapter" not in str(root.attributes)


def test_a_malformed_traceparent_starts_a_new_trace(traced: Traced) -> None:
    live, receiver = traced.live, traced.receiver
    before = {s.trace_id for s in receiver.snapshot()}
    reply = _post(live, "acme", {"traceparent": "00-zz-not-a-trace-01"}, model="missing")
    assert reply.status_code == 404
    _flush(live)
    spans = receiver.wait_for(lambda s: {x.trace_id for x in s} - before)
    roots = [s for s in spans if s.trace_id not in before and s.kind == 2]
    assert len(roots) == 1 and roots[0].parent_span_id == ""


def test_a_traceparent_given_twice_starts_a_new_trace(traced: Traced) -> None:
    """W3C Trace Context: more than one ``traceparent`` is invalid, so a new trace; the first
    one was followed before (a proxy appending its own made the trace the client's)."""
    live, receiver = traced.live, traced.receiver
    before = {s.trace_id for s in receiver.snapshot()}
    given = ["0af7651916cd43dd8448eb211c80319c", "5a1f6e2b9c3d4e7f8a0b1c2d3e4f5061"]
    headers = [("Authorization", f"Bearer {live.key('acme')}")]
    headers += [("traceparent", f"00-{trace}-{CALLER_SPAN}-01") for trace in given]
    payload = {"model": "missing", "prompt": "x", "max_tokens": 1}
    reply = httpx.post(f"{live.url}/v1/completions", json=payload, headers=headers, timeout=120)
    assert reply.status_code == 404, reply.text
    _flush(live)
    spans = receiver.wait_for(lambda s: {x.trace_id for x in s} - before)
    roots = [s for s in spans if s.trace_id not in before and s.kind == 2]
    assert len(roots) == 1 and roots[0].parent_span_id == ""
    assert roots[0].trace_id not in given
    assert not any(s.trace_id in given for s in spans)
