"""Where a decode-mix request's tokens come together (issue 30, CALFAULT).

Runs ``sim calibrate --self``'s decode mixes (``calibrate_run.mixes``, each adapter prefetched
into a GPU slot first) against a fresh demo server with its request log on, and records for
every request, beside the client's TPOT as ``send_one`` computes it:

- each SSE event's arrival (monotonic), the HTTP chunk it came in (the server's writes:
  uvicorn/the listener sends each piece ``stream_buffer`` yields as one chunk) and whether it
  carried text;
- the engine's own timeline of the request (the request log's ``engine`` object): its first
  step's end and its end, so ``(end_s - first_step_end_s) / (tokens - 1)`` is its TPOT on the
  engine's clock.

Writes one JSON object per request to ``--out`` and prints a summary: client TPOT beside the
engine's, text events per request (fewer than its tokens: the front merged deltas,
``transport/streams.outbox_stream``), events per HTTP chunk (more than one: the writer took
several at once, ``stream_buffer``).

    PYTHONPATH=.:scripts/calfault/hook CALFAULT_SERVER_LOG=/tmp/server.jsonl \
        python scripts/calfault/streams.py --repeats 3 [--max-mixes 12] --out /tmp/streams.jsonl

With ``CALFAULT_SERVER_LOG`` (the hook, ``hook/sitecustomize.py``, loads in the server process
through ``PYTHONPATH``) each row also holds the server's ``puts`` and ``takes`` (by completion
id), and every row the client loop's stalls during its mix (``client_stalls``: when, how late,
how much of it on a CPU run queue). NOTE: a row is paired with its log line by adapter in
order, so in a mix with several requests per adapter the engine TPOT may be a sibling's.
docs/simulator.md, "CALFAULT".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from loraplex.bench.serve.driver import prompt_ids
from loraplex.bench.sim.calibrate_loads import into_slots
from loraplex.bench.sim.calibrate_run import CalibrateConfig, mixes, slots_for_mixes
from loraplex.bench.sim.calibrate_target import ServedAdapter, Target, self_target
from loraplex.bench.sim.calibrate_timeline import log_lines, log_size
from loraplex.bench.sse_client import StreamingPost


async def _one(target: Target, adapter: ServedAdapter, ids: list[int], tokens: int) -> dict:
    body = {
        "model": adapter.name,
        "prompt": ids,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    headers = {"Authorization": f"Bearer {target.keys[adapter.tenant]}"}
    events: list[tuple[float, int, bool]] = []  # (arrival, chunk index, text)
    usage, completion_id = None, None
    sent = time.monotonic()
    async with StreamingPost(target.url, "/v1/completions", body, headers) as post:
        chunk_index = 0
        async for chunk in post._chunks():
            now = time.monotonic()
            for line in chunk.decode("utf-8").split("\n"):
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                payload = json.loads(line[6:])
                completion_id = payload.get("id", completion_id)
                if payload.get("usage"):
                    usage = payload["usage"]["completion_tokens"]
                    continue
                text = any(c.get("text") or c.get("finish_reason") for c in payload["choices"])
                events.append((now, chunk_index, text))
            chunk_index += 1
    texts = [e for e in events if e[2]]
    client_tpot = None
    if usage and usage > 1 and texts:
        client_tpot = (texts[-1][0] - texts[0][0]) / (usage - 1)
    return {
        "adapter": f"{adapter.name}@{adapter.revision}",
        "id": completion_id,
        "sent": sent,
        "tokens": usage,
        "client_tpot_s": client_tpot,
        "text_events": len(texts),
        "chunks": chunk_index,
        "events_per_text_chunk": max(
            (sum(1 for e in texts if e[1] == c) for c in {e[1] for e in texts}), default=0
        ),
        "first_s": texts[0][0] - sent if texts else None,
        "arrivals": [e[0] for e in texts],
    }


def _run_delay_s() -> float:
    """Seconds this thread has waited on a CPU run queue (runnable, not running) so far."""
    with open("/proc/thread-self/schedstat", encoding="ascii") as f:
        return int(f.read().split()[1]) / 1e9


async def _ticker(lags: list[tuple[float, float, float]], period_s: float = 0.001) -> None:
    """The client loop's own stalls: each wake more than 5 ms past its time (when, how late,
    and how much of that the thread waited on a run queue: descheduled, not busy)."""
    while True:
        due, waited = time.monotonic() + period_s, _run_delay_s()
        await asyncio.sleep(period_s)
        late = time.monotonic() - due
        if late > 0.005:
            lags.append((due, late, _run_delay_s() - waited))


async def _mix(target: Target, batch: int, chosen: tuple, config: CalibrateConfig, seed: int):
    rng = random.Random(seed)
    sends = []
    for i in range(batch):
        ids = prompt_ids(rng, config.prompt_tokens, target.vocab_size)
        sends.append(_one(target, chosen[i % len(chosen)], ids, config.output_tokens))
    lags: list[tuple[float, float, float]] = []
    ticker = asyncio.ensure_future(_ticker(lags))
    rows = await asyncio.gather(*sends)
    ticker.cancel()
    for row in rows:
        row["client_stalls"] = lags
    return rows


def _engine(rows: list[dict], lines: list[dict[str, Any]]) -> None:
    """Pairs each row with its request-log line (by adapter, in order) and adds the engine's
    TPOT."""
    by_adapter: dict[str, list[dict]] = {}
    for line in lines:
        if line.get("output_tokens") and line.get("engine"):
            by_adapter.setdefault(str(line["adapter"]), []).append(line)
    for row in sorted(rows, key=lambda r: r["sent"]):
        found = by_adapter.get(row["adapter"]) or []
        line = found.pop(0) if found else None
        engine = (line or {}).get("engine") or {}
        first, end = engine.get("first_step_end_s"), engine.get("end_s")
        row["engine_tpot_s"] = (
            (end - first) / (row["tokens"] - 1)
            if first is not None and end is not None and row["tokens"] and row["tokens"] > 1
            else None
        )
        row["engine_first_step_end_s"] = first
        row["engine_end_s"] = end


def _server(rows: list[dict], path: Path) -> None:
    """Adds each request's server-side event times (``hook/sitecustomize.py``): when each event
    was produced (``puts``) and when the writer took events for the socket (``takes``: time,
    events taken at once)."""
    puts: dict[str, list[float]] = {}
    takes: dict[str, list[tuple[float, int]]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record["k"] == "put":
            puts.setdefault(record["id"], []).append(record["t"])
        else:
            takes.setdefault(record["id"], []).append((record["t"], record["n"]))
    for row in rows:
        row["puts"] = puts.get(row["id"], [])
        row["takes"] = takes.get(row["id"], [])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-mixes", type=int, default=None, help="only the first N mixes")
    parser.add_argument("--assets", type=Path, default=Path(".loraplex-assets"))
    args = parser.parse_args()
    config = CalibrateConfig(repeats=args.repeats)
    rows: list[dict] = []
    with self_target(
        args.assets, (8, 16, 32, 64), 2, slots_for_mixes(config), 0, target_sets=("attn", "all")
    ) as target:
        assert target.request_log is not None
        headers = {"Authorization": f"Bearer {target.admin_key}"}
        with httpx.Client(base_url=target.url, headers=headers, timeout=60.0) as client:
            chosen_mixes = mixes(target.adapters, config)[: args.max_mixes]
            for index, (batch, chosen) in enumerate(chosen_mixes):
                into_slots(client, target.adapters, chosen)
                for repeat in range(config.repeats):
                    offset = log_size(target.request_log)
                    got = asyncio.run(_mix(target, batch, chosen, config, 1000 * index + repeat))
                    time.sleep(0.3)  # the log's lines are written as requests finish
                    _engine(got, log_lines(target.request_log, offset))
                    for row in got:
                        row.update(mix=index, batch=batch, revisions=len(chosen), repeat=repeat)
                    rows += got
    server_log = os.environ.get("CALFAULT_SERVER_LOG")
    if server_log:
        _server(rows, Path(server_log))
    with args.out.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    _summary(rows)


def _summary(rows: list[dict]) -> None:
    tpots = [r for r in rows if r["client_tpot_s"] is not None and r["engine_tpot_s"]]
    under = [r for r in tpots if r["client_tpot_s"] < 0.5 * r["engine_tpot_s"]]
    merged = [r for r in rows if r["tokens"] and r["text_events"] < r["tokens"]]
    coalesced = [r for r in rows if r["events_per_text_chunk"] > 1]
    ratio = [r["client_tpot_s"] / r["engine_tpot_s"] for r in tpots]
    sys.stdout.write(
        json.dumps(
            {
                "requests": len(rows),
                "client_under_half_engine": len(under),
                "deltas_merged_requests": len(merged),
                "writes_coalesced_requests": len(coalesced),
                "client_over_engine_tpot_median": statistics.median(ratio) if ratio else None,
                "client_over_engine_tpot_min": min(ratio) if ratio else None,
                "under": [
                    {
                        k: r[k]
                        for k in (
                            "batch",
                            "revisions",
                            "client_tpot_s",
                            "engine_tpot_s",
                            "text_events",
                            "chunks",
                            "events_per_text_chunk",
                            "first_s",
                        )
                    }
                    for r in under[:20]
                ],
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
