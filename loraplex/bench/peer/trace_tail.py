"""Where the time of ``bench peer``'s slowest trace requests went (``scripts/peer-trace``).

The client sees a request's TTFT from its scheduled arrival; the server's request log
(``server/request_log.py``) says, for the same request, the tier its adapter was leased from and
the engine's timeline (lease asked and collected, first scheduled, first step's end). Joining the
two splits a slow TTFT into: the client's own lateness plus the HTTP front (client TTFT less the
server's), the wait before the first step (``scheduled_s``), the first step itself
(``first_step_end_s`` less ``scheduled_s``: a prefill, or a step that carried other requests'
prefills), and the token's way out (the server's TTFT less ``first_step_end_s``).

A log line is matched to a client record by adapter and arrival time: the log's clock starts
when the server opened it, so the two clocks differ by an offset, the one that lines up the most
arrivals (``clock_offset``).
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraplex.bench.peer.client import BatchResult, Route
from loraplex.bench.serve.driver import RequestRecord
from loraplex.residency.stats import percentile

MATCH_TOLERANCE_S = 0.5  # a log line further than this from the client's arrival is no match
OFFSET_TOLERANCE_S = 0.02  # client to server arrival, at most, when the clock offset is judged


@dataclass(frozen=True)
class LoggedLine:
    """The request-log fields the tail report reads (seconds)."""

    t_s: float  # arrival on the log's clock
    adapter: str | None  # ``name@revision``; None: the base model
    tier: str | None  # the tier its adapter was leased from
    ttft_s: float | None  # the server's arrival to first token
    engine: dict[str, float | None]  # the engine's timeline (request_log.ENGINE_FIELDS)


def read_log_tail(path: Path, count: int) -> list[LoggedLine]:
    """The last ``count`` lines of a request log (a lifetime's trace requests: they finish
    after everything the lifetime sent before), in arrival order."""
    lines = path.read_text(encoding="utf-8").splitlines()[-count:] if count else []
    out = []
    for text in lines:
        body = json.loads(text)
        engine = body.get("engine") or {}
        out.append(LoggedLine(body["t_s"], body["adapter"], body["tier"], body["ttft_s"], engine))
    return sorted(out, key=lambda line: line.t_s)


def clock_offset(records: Sequence[RequestRecord], lines: Sequence[LoggedLine]) -> float:
    """Log clock minus client clock: of the differences between the i-th arrivals of each (the
    right one wherever no request is missing before the i-th), the one that puts the most
    records within OFFSET_TOLERANCE_S of a logged arrival."""
    client = sorted(r.t_s for r in records)
    logged = sorted(line.t_s for line in lines)
    candidates = sorted({b - a for a, b in zip(client, logged, strict=False)})
    return max(candidates, key=lambda c: _num_close(client, logged, c), default=0.0)


def _num_close(client: Sequence[float], logged: Sequence[float], offset: float) -> int:
    count = 0
    for t_s in client:
        i = bisect.bisect_left(logged, t_s + offset - OFFSET_TOLERANCE_S)
        count += i < len(logged) and logged[i] <= t_s + offset + OFFSET_TOLERANCE_S
    return count


def match_lines(
    records: Sequence[RequestRecord], routes: Sequence[Route], lines: Sequence[LoggedLine]
) -> list[LoggedLine | None]:
    """Each record's log line (same adapter, nearest arrival within MATCH_TOLERANCE_S, each
    line used once); None where none matched."""
    offset = clock_offset(records, lines)
    free = list(lines)
    matched: list[LoggedLine | None] = []
    for record in records:
        model = _model_of(record, routes)
        candidates = [line for line in free if line.adapter == model]
        best = min(candidates, key=lambda line: abs(line.t_s - offset - record.t_s), default=None)
        if best is None or abs(best.t_s - offset - record.t_s) > MATCH_TOLERANCE_S:
            matched.append(None)
            continue
        free.remove(best)
        matched.append(best)
    return matched


def _model_of(record: RequestRecord, routes: Sequence[Route]) -> str | None:
    """The adapter's ``name@revision`` as the log writes it (None: the base model's route)."""
    return None if record.adapter == routes[-1].model else record.adapter


def breakdown(record: RequestRecord, line: LoggedLine | None, start_s: float) -> dict[str, Any]:
    """One request's TTFT split into where it went (ms), the tier its adapter was leased from
    beside; ``t_s`` its arrival in seconds after ``start_s`` (the trace's first)."""
    out: dict[str, Any] = {"t_s": round(record.t_s - start_s, 3), "adapter": record.adapter}
    out["ttft_ms"] = ms(record.ttft_s)
    out["reply_ms"] = ms(record.reply_s)  # to the reply's status line: the front's part before
    if line is None:
        return out | {"matched": False}
    e = line.engine
    scheduled, first_end = e.get("scheduled_s"), e.get("first_step_end_s")
    lease, asked = e.get("lease_s"), e.get("asked_s")
    out |= {
        "tier": line.tier,
        "server_ttft_ms": ms(line.ttft_s),
        "client_and_front_ms": ms(_minus(record.ttft_s, line.ttft_s)),
        "lease_wait_ms": ms(_minus(lease, asked)),
        "load_ms": ms(e.get("load_s")),
        "queue_ms": ms(scheduled),
        "first_step_ms": ms(_minus(first_end, scheduled)),
        "way_out_ms": ms(_minus(line.ttft_s, first_end)),
    }
    return out


def ms(value: float | None) -> float | None:
    """Seconds as milliseconds (2 decimals); None (and a failure's infinity) as None."""
    return None if value is None or not math.isfinite(value) else round(value * 1000, 2)


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def trace_ttfts(trace: BatchResult) -> dict[str, Any]:
    """One lifetime's trace: its requests, completed ones, client P50 and P99 TTFT (ms; a
    failed request counts as the slowest, and a P99 that falls on one is None)."""
    ttfts = sorted(math.inf if r.ttft_s is None else r.ttft_s for r in trace.records)
    return {
        "requests": len(ttfts),
        "completed": trace.completed,
        "p50_ttft_ms": ms(percentile(ttfts, 0.5)),
        "p99_ttft_ms": ms(percentile(ttfts, 0.99)),
    }


def tail_report(
    trace: BatchResult, routes: Sequence[Route], log_path: Path, fraction: float
) -> dict[str, Any]:
    """``trace_ttfts``, and the slowest ``fraction`` of the requests (at least one), each
    broken down (``breakdown``), slowest first."""
    lines = read_log_tail(log_path, len(trace.records))
    matched = match_lines(trace.records, routes, lines)
    ttfts = [math.inf if r.ttft_s is None else r.ttft_s for r in trace.records]
    ranked = sorted(range(len(ttfts)), key=lambda i: -ttfts[i])  # slowest (failed) first
    num_slow = max(1, math.ceil(fraction * len(ttfts)))
    start_s = min((r.t_s for r in trace.records), default=0.0)
    return trace_ttfts(trace) | {
        "matched": sum(m is not None for m in matched),
        "slowest": [breakdown(trace.records[i], matched[i], start_s) for i in ranked[:num_slow]],
    }
