"""A real server with ``mode = merged:<ref>`` and its engine in its own process: the merge's
measured time reaches ``/metrics`` across the process boundary and the trace of a request that
waited for it, and the admin API refuses to deprecate the merged revision or move its alias off
it (409 naming it), docs/modes.md."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from live import Live, live_server
from otlp_receiver import OtlpReceiver

from loraplex.demo.assets import DemoAssets
from loraplex.engine.transport.process import EngineProcess
from loraplex.tracing.exporter import Tracer

ADMIN = "test-admin-credential-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
MERGED = "acme/support@r2"  # the alias points at r1, the first revision registered
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def _to(revision: str) -> dict[str, object]:
    return {"targets": [{"revision": revision, "weight": 1}]}


def _scrape_until(live: Live, series: str) -> str:
    """/metrics once ``series`` is in it: the engine process publishes its first state (with
    the mode's series) a moment after the server answers, and a scrape before shows none."""
    deadline = time.monotonic() + 60
    while True:
        text = httpx.get(f"{live.url}/metrics", headers=AUTH, timeout=30).text
        if series in text or time.monotonic() > deadline:
            return text
        time.sleep(0.1)


def _scrape_until_merged(live: Live) -> str:
    deadline = time.monotonic() + 60
    while True:
        text = httpx.get(f"{live.url}/metrics", headers=AUTH, timeout=30).text
        if 'loraplex_mode_transition_seconds_count{direction="merge"} 1.0' in text:
            return text
        assert time.monotonic() < deadline, text
        time.sleep(0.2)


def test_merged_mode_exports_its_transition_and_guards_the_merged_revision(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    with OtlpReceiver() as receiver:
        config = {"admin_key": ADMIN, "max_loras": 4, "mode": f"merged:{MERGED}"}
        tracing = {"trace_endpoint": receiver.url, "trace_sample_ratio": 0.0}
        with live_server(demo_assets, tmp_path, **config, **tracing) as live:
            assert isinstance(live.server.engine, EngineProcess)  # across the process boundary
            series = 'loraplex_mode_transition_seconds_count{direction="merge"}'
            before = _scrape_until(live, series)
            assert f"{series} 0.0" in before
            assert "loraplex_mode_merged 0.0" in before
            _the_first_request_waits_for_the_merge_in_its_trace(live, receiver)
            _metrics_and_the_admin_guard(live)


def _the_first_request_waits_for_the_merge_in_its_trace(live: Live, receiver: OtlpReceiver) -> None:
    """The first request names the revision; the merge follows between two of its steps.
    NOTE: with 8 tokens a run on a loaded machine once saw no ``mode_transition`` span (not
    reproduced); the one way we see there is the merge landing after the request ended: its
    lease is asked at the boundary after the step that first saw the revision, then it stages a
    budgeted piece per boundary, within the request's 7 decode boundaries. 48 leave it 47."""
    reply = httpx.post(
        f"{live.url}/v1/completions",
        json={"model": "support@r2", "prompt": "The acme support team", "max_tokens": 48,
              "temperature": 0, "ignore_eos": True},
        headers={"Authorization": f"Bearer {live.key('acme')}",
                 "traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"},
        timeout=120,
    )  # fmt: skip
    assert reply.status_code == 200, reply.text
    tracer = live.server.deps.tracing
    assert isinstance(tracer, Tracer) and tracer.flush(30.0)
    spans = receiver.wait_for(lambda got: any(x.trace_id == TRACE for x in got))
    marks = [s for s in spans if s.trace_id == TRACE and s.name == "loraplex.mode_transition"]
    assert len(marks) == 1, [s.name for s in spans]
    attrs = marks[0].attributes
    assert attrs["loraplex.mode.direction"] == "merge"
    assert attrs["loraplex.mode.transition_s"] > 0
    assert attrs["loraplex.mode.revision"].startswith("h:")  # names are keyed hashes


def _metrics_and_the_admin_guard(live: Live) -> None:
    text = _scrape_until_merged(live)
    assert "loraplex_mode_merged 1.0" in text
    assert 'loraplex_mode_transition_seconds_count{direction="unmerge"} 0.0' in text
    merge_sum = next(
        line for line in text.splitlines()
        if line.startswith('loraplex_mode_transition_seconds_sum{direction="merge"}')
    )  # fmt: skip
    assert float(merge_sum.split()[-1]) > 0.0

    http = httpx.Client(base_url=live.url, headers=AUTH, timeout=60)
    onto = http.put("/admin/adapters/acme/support/alias", json=_to("r2"))
    assert onto.status_code == 200, onto.text  # moving onto the merged revision is fine
    for refused in (
        http.post("/admin/adapters/acme/support/rollback"),
        http.put("/admin/adapters/acme/support/alias", json=_to("r1")),
        http.put("/admin/revisions/acme/support/r2", json={"state": "deprecated"}),
    ):
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "revision_merged"
        assert MERGED in error["message"]
    alias = http.get("/admin/adapters/acme/support").json()["alias"]
    assert [t["revision"] for t in alias["targets"]] == ["r2"]  # nothing changed
    revisions = http.get("/admin/adapters/acme/support").json()["revisions"]
    assert {r["revision"]: r["state"] for r in revisions}["r2"] != "deprecated"
    other = http.put("/admin/revisions/acme/support/r1", json={"state": "deprecated"})
    assert other.status_code == 200, other.text  # only the merged revision is guarded
    engine = live.server.engine
    assert isinstance(engine, EngineProcess)
    both = frozenset({MERGED, "acme/support@r1"})
    assert engine.merge_holds.hold(both) == {MERGED}  # answered by the child, across the pipe
    engine.merge_holds.release(both)
