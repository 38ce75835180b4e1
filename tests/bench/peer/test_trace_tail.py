"""``bench.peer.trace_tail``: a trace's client records joined with the server's request log."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from loraplex.bench.peer.client import BatchResult, Route
from loraplex.bench.peer.trace_tail import match_lines, read_log_tail, tail_report
from loraplex.bench.serve.driver import RequestRecord

ROUTES = (Route("a@r1", "k"), Route("b@r1", "k"), Route("base", "k"))
CLIENT_T0 = 5000.0  # the client's monotonic clock at the trace's start
LOG_T0 = 40.0  # the same instant on the log's clock


def _record(t_s: float, adapter: str, ttft_s: float | None) -> RequestRecord:
    status = 200 if ttft_s is not None else 0
    return RequestRecord(
        CLIENT_T0 + t_s, "peer", adapter, "L0", status, ttft_s, None, 4, None, None
    )


def _line(t_s: float, adapter: str | None, ttft_s: float, first_step_end_s: float) -> str:
    engine = {
        "asked_s": 0.001,
        "ready_s": None,
        "lease_s": 0.001,
        "scheduled_s": 0.002,
        "first_step_end_s": first_step_end_s,
        "end_s": 0.2,
        "load_s": 0.0,
        "room_wait_s": 0.0,
    }
    body = {"t_s": LOG_T0 + t_s, "adapter": adapter, "tier": "L0", "ttft_s": ttft_s}
    return json.dumps(body | {"engine": engine, "outcome": "length"})


def _log(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_the_log_tail_is_the_trace_in_arrival_order(tmp_path: Path) -> None:
    earlier = _line(-30.0, "a@r1", 0.01, 0.008)  # a batch request before the trace
    path = _log(
        tmp_path, [earlier, _line(0.5, "b@r1", 0.01, 0.008), _line(0.1, "a@r1", 0.01, 0.008)]
    )
    lines = read_log_tail(path, 2)
    assert [(line.t_s, line.adapter) for line in lines] == [(40.1, "a@r1"), (40.5, "b@r1")]


def test_records_match_lines_by_adapter_and_arrival_across_clocks(tmp_path: Path) -> None:
    # two arrivals 2 ms apart, in the opposite order on the server: the adapter decides
    records = [_record(0.100, "a@r1", 0.02), _record(0.102, "b@r1", 0.02)]
    path = _log(tmp_path, [_line(0.101, "b@r1", 0.01, 0.008), _line(0.103, "a@r1", 0.01, 0.008)])
    matched = match_lines(records, ROUTES, read_log_tail(path, 2))
    assert [m.adapter if m else None for m in matched] == ["a@r1", "b@r1"]


def test_a_record_without_its_line_is_unmatched(tmp_path: Path) -> None:
    # the second request never reached the log: the i-th arrivals pair up wrongly after it
    times = (0.1, 0.7, 1.3, 2.0)
    records = [_record(t, "b@r1" if t == 0.7 else "a@r1", 0.02) for t in times]
    lines = [_line(t, "a@r1", 0.01, 0.008) for t in (0.1, 1.3, 2.0, 2.6)]
    matched = match_lines(records, ROUTES, read_log_tail(_log(tmp_path, lines), 4))
    assert [m is not None for m in matched] == [True, False, True, True]
    assert [m.t_s for m in matched if m is not None] == pytest.approx([40.1, 41.3, 42.0])


def test_the_slowest_requests_are_split_into_their_stages(tmp_path: Path) -> None:
    records = [_record(i * 0.2, "a@r1", 0.015) for i in range(99)]
    # the slow one: 120 ms outside the server, 110 of them before the reply's status line
    records.append(replace(_record(20.0, "b@r1", 0.150), reply_s=0.110))
    lines = [_line(r.t_s - CLIENT_T0, r.adapter, 0.012, 0.009) for r in records[:-1]]
    lines.append(_line(20.0, "b@r1", 0.030, 0.027))
    trace = BatchResult(tuple(records), 21.0)
    report = tail_report(trace, ROUTES, _log(tmp_path, lines), 0.02)
    assert report["requests"] == 100 and report["matched"] == 100
    # nearest rank: P99 of 100 is the second slowest (bench peer's rule, report.ttft_ms)
    assert report["p50_ttft_ms"] == 15.0 and report["p99_ttft_ms"] == 15.0
    assert len(report["slowest"]) == 2  # ceil(2 % of 100)
    slow = report["slowest"][0]
    assert slow["adapter"] == "b@r1" and slow["t_s"] == pytest.approx(20.0)
    assert slow["ttft_ms"] == 150.0 and slow["server_ttft_ms"] == 30.0
    assert slow["client_and_front_ms"] == 120.0 and slow["reply_ms"] == 110.0
    assert report["slowest"][1]["reply_ms"] is None  # a record without its reply time
    assert slow["queue_ms"] == 2.0 and slow["first_step_ms"] == 25.0 and slow["way_out_ms"] == 3.0
    assert slow["lease_wait_ms"] == 0.0 and slow["load_ms"] == 0.0 and slow["tier"] == "L0"


def test_a_failed_request_is_the_slowest(tmp_path: Path) -> None:
    records = [_record(0.0, "a@r1", 0.01), _record(1.0, "a@r1", None)]
    path = _log(tmp_path, [_line(0.0, "a@r1", 0.008, 0.006), _line(1.0, "a@r1", 0.008, 0.006)])
    report = tail_report(BatchResult(tuple(records), 2.0), ROUTES, path, 0.5)
    assert report["completed"] == 1 and report["slowest"][0]["ttft_ms"] is None
