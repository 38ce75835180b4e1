"""``request_log_path``: one JSONL line per finished request in the simulator's trace format,
readable by ``loraplex.sim.trace.read_trace`` and replayable by ``simulate`` (issue 30)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import BASE_NAME, Served, make_app_deps
from fakes import FakeEngine
from fastapi.testclient import TestClient
from httpx import Response

from loraplex.residency.ledger import Tier
from loraplex.serve.config import ServeConfig, read_config_file
from loraplex.server.app import create_app
from loraplex.server.request_log import LoggedRequest, RequestLog
from loraplex.sim import cost_model
from loraplex.sim.config import SimConfig
from loraplex.sim.run import simulate
from loraplex.sim.trace import (
    OUTCOME_FIELDS,
    SHAPE_FIELDS,
    TRACE_FIELDS,
    parse_record,
    read_trace,
)

COST = Path(__file__).resolve().parents[1] / "sim" / "cost_example.json"


def _post(client: TestClient, served: Served, tenant: str, body: dict[str, object]) -> Response:
    headers = {"Authorization": f"Bearer {served.keys[tenant]}"}
    return client.post("/v1/completions", json=body, headers=headers)


def test_finished_requests_are_logged_and_replay_in_the_simulator(
    served: Served, tmp_path: Path
) -> None:
    log = tmp_path / "requests.jsonl"
    engine = FakeEngine(leased_from=Tier.L1)
    deps = make_app_deps(served, engine, request_log_path=log)
    with TestClient(create_app(deps)) as client:
        bodies = [
            ("acme", {"model": "support", "prompt": "hi", "max_tokens": 3}),
            ("globex", {"model": "search", "prompt": "hello", "max_tokens": 5}),
            ("acme", {"model": BASE_NAME, "prompt": "x", "max_tokens": 2}),
        ]
        responses = [_post(client, served, tenant, body) for tenant, body in bodies]
    assert [r.status_code for r in responses] == [200, 200, 200]
    if deps.cache is not None:
        deps.cache.close()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == 3
    for line in lines[:2]:  # adapters: with their shape (rank, bytes once loaded)
        assert set(line) == {*TRACE_FIELDS, *SHAPE_FIELDS, *OUTCOME_FIELDS}
    assert set(lines[2]) == {*TRACE_FIELDS, *OUTCOME_FIELDS}  # the base model has none
    for line in lines:
        assert "hi" not in json.dumps(line) and "hello" not in json.dumps(line)  # no prompt text
    first, second, base = lines
    assert (first["tenant"], first["adapter"]) == ("acme", "support@r1")
    assert (second["tenant"], second["adapter"]) == ("globex", "search@r1")
    assert base["adapter"] is None and base["tier"] is None
    usage = responses[0].json()["usage"]
    assert first["outcome"] == responses[0].json()["choices"][0]["finish_reason"]
    assert first["output_tokens"] == usage["completion_tokens"]
    assert first["prompt_tokens"] == usage["prompt_tokens"]
    assert first["tier"] == "L1" and first["ttft_s"] is not None
    assert first["prompt_tokens"] == len(engine.requests[0].prompt_token_ids)
    assert all(r.stages for r in engine.requests)  # the engine is asked for its timeline
    assert 0 <= first["t_s"] <= second["t_s"] <= base["t_s"]
    trace = read_trace(log)
    assert [r.adapter for r in trace] == ["support@r1", "search@r1", None]
    result = simulate(trace, SimConfig(), cost_model.load(COST))
    assert result.metrics["requests"] == 3 and result.metrics["completed"] == 3
    assert result.metrics["acquires"] == 2  # the base-model request takes no adapter


def test_a_failed_request_logs_what_it_asked_for(served: Served, tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    engine = FakeEngine(mid_stream_errors={"acme/support@r1": RuntimeError("boom")})
    deps = make_app_deps(served, engine, request_log_path=log)
    with TestClient(create_app(deps), raise_server_exceptions=False) as client:
        _post(client, served, "acme", {"model": "support", "prompt": "hi", "max_tokens": 7})
    if deps.cache is not None:
        deps.cache.close()
    (line,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert line["outcome"] == "error" and line["output_tokens"] == 7


def test_the_log_is_off_by_default_and_reached_from_the_serve_config(tmp_path: Path) -> None:
    assert ServeConfig(data_dir=tmp_path).request_log_path is None
    file = tmp_path / "serve.toml"
    file.write_text('[serve]\nrequest_log_path = "logs/requests.jsonl"\n', encoding="utf-8")
    values = read_config_file(file)
    assert values["request_log_path"] == tmp_path / "logs" / "requests.jsonl"


def test_a_log_in_a_missing_directory_is_refused_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"request_log_path .* directory does not exist"):
        RequestLog(tmp_path / "absent" / "requests.jsonl")


def test_lines_are_relative_to_the_log_opening(tmp_path: Path) -> None:
    log = RequestLog(tmp_path / "r.jsonl", clock=lambda: 100.0)
    request = LoggedRequest(
        arrived_s=102.5, tenant="t", revision="t/a@r2", prompt_tokens=4, max_tokens=9,
        completion_tokens=2, outcome="stop", ttft_s=0.1, tier="L0", latency_s=0.3,
    )  # fmt: skip
    log.write(request)
    (line,) = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert (line["t_s"], line["adapter"], line["output_tokens"]) == (2.5, "a@r2", 2)


def test_a_restarted_server_continues_the_logs_timeline(tmp_path: Path) -> None:
    """``t_s`` counted from each start: a server restarted on its log wrote its first requests
    at 0 again, and a replay of the file laid the two runs over one another. A log that holds
    lines now goes on from the latest end in it plus the time since the file was last written."""
    path = tmp_path / "r.jsonl"
    before = LoggedRequest(104.0, "t", "t/a@r1", 4, 9, 9, "stop", 0.1, "L0", 0.5)
    RequestLog(path, clock=lambda: 100.0, wall=lambda: 0.0).write(before)  # t_s 4.0, ends 4.5
    os.utime(path, (1_000.0, 1_000.0))  # last written at wall time 1000
    restarted = RequestLog(path, clock=lambda: 7.0, wall=lambda: 1_010.0)  # 10 s later
    restarted.write(replace(before, arrived_s=9.0))  # 2 s after the restart
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [line["t_s"] for line in lines] == [4.0, 16.5]  # 4.5 + 10 + 2
    trace = read_trace(path)
    assert [r.t_s for r in trace] == [4.0, 16.5]


def test_a_log_without_lines_of_this_format_starts_at_zero(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('not json\n{"t_s": "x"}\n[1]\n')
    log = RequestLog(path, clock=lambda: 100.0, wall=lambda: 1e9)
    request = LoggedRequest(102.5, "t", None, 4, 9, 2, "stop", 0.1, None, 0.3)
    assert json.loads(log.line(request))["t_s"] == 2.5


def test_another_tenants_public_adapter_is_logged_with_its_owner(tmp_path: Path) -> None:
    """acme calling globex's public ``translate`` was logged as acme's ``translate@r1``: an
    adapter acme does not have (a replay over HTTP asked acme for it: a 404, or acme's own
    ``translate`` if it had one), and one the simulator could not tell from acme's own. Its
    line names the owner now, as the model string a replay sends; acme's own stay bare."""
    log = RequestLog(tmp_path / "r.jsonl", clock=lambda: 0.0)
    public = LoggedRequest(1.0, "acme", "globex/translate@r1", 4, 2, 2, "stop", 0.1, None, 0.2)
    own = replace(public, revision="acme/translate@r3")
    lines = [json.loads(log.line(request)) for request in (public, own)]
    assert [line["adapter"] for line in lines] == ["globex/translate@r1", "translate@r3"]
    records = [parse_record(line) for line in lines]
    assert len({(r.tenant, r.adapter) for r in records}) == 2  # two adapters in a replay


def test_the_engines_timeline_is_written_in_seconds_after_its_arrival(tmp_path: Path) -> None:
    from loraplex.engine.trace_log import TraceLog
    from loraplex.server.request_log import ENGINE_FIELDS

    log = TraceLog(arrival_s=10.0)
    log.defer(10.001)
    log.ready(10.004)
    log.leased(10.0045, Tier.L1, {"copy": 0.002}, 0.0)
    log.batch(10.012, 1, 1, "masked")
    trace = log.finish(10.030, queue_s=0.005, base=False)
    request_log = RequestLog(tmp_path / "r.jsonl", clock=lambda: 0.0)
    logged = LoggedRequest(1.0, "acme", "acme/support@r1", 4, 2, 2, "length", 0.02, "L1", 0.04)
    line = json.loads(request_log.line(replace(logged, engine=trace)))
    assert set(line["engine"]) == set(ENGINE_FIELDS)
    assert line["engine"] == pytest.approx(
        {
            "asked_s": 0.001,
            "ready_s": 0.004,
            "lease_s": 0.0045,
            "scheduled_s": 0.005,
            "first_step_end_s": 0.012,
            "end_s": 0.03,
            "load_s": 0.002,
            "room_wait_s": 0.0,
        }
    )
    assert json.loads(request_log.line(logged))["engine"] is None
    assert read_trace_line(request_log.line(replace(logged, engine=trace)))


def read_trace_line(text: str) -> bool:
    """A line with an engine timeline still reads as a simulator trace record."""
    from loraplex.sim.trace import parse_record

    return parse_record(json.loads(text)).prompt_tokens == 4


def test_each_adapter_line_carries_the_revisions_rank_and_bytes(
    served: Served, tmp_path: Path
) -> None:
    """The log had no ``rank`` or ``size_bytes``, so a replay priced every adapter at the
    simulator's default rank 16 and bytes per rank (1 MiB), whatever it was (newop4)."""
    log = tmp_path / "requests.jsonl"
    deps = make_app_deps(served, FakeEngine(), request_log_path=log)
    with TestClient(create_app(deps)) as client:
        for model in ("support", "billing"):
            body = {"model": model, "prompt": "hi", "max_tokens": 2}
            assert _post(client, served, "acme", body).status_code == 200
    if deps.cache is not None:
        deps.cache.close()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    for line in lines:
        name, _, label = line["adapter"].partition("@")
        revision = served.registry.get_revision(f"acme/{name}@{label}")
        assert (line["rank"], line["size_bytes"]) == (revision.max_rank, revision.estimated_bytes)
    trace = read_trace(log)
    assert [(r.rank, r.size_bytes) for r in trace] == [(x["rank"], x["size_bytes"]) for x in lines]
