"""What a lone warm request's TTFT depends on outside the engine step (issue 30, SIMVAL).

``sim calibrate`` fitted the hop (``front_s + ipc_s``) on lone warm requests sent back to back
with ``max_tokens`` 1; a trace's requests find the server idle, generate several tokens and are
sent by ``bench serve``'s replay driver (``bench/serve/driver.replay_over_http``, which ``bench
sim``'s real runs use). On a fresh ``--self`` demo server (``sim calibrate``'s), one warm
adapter, the same prompts in three groups: ``back-to-back`` (each prompt with ``max_tokens`` 1
and ``--max-tokens``, ABBA), ``idle`` (the same, each after ``--gap-s`` of idleness) and
``replay`` (``--max-tokens`` each, replayed as a trace with arrivals ``--gap-s`` apart). Per
group it prints the medians (ms) of the driver's TTFT, the first SSE chunk's time (the driver
counts the first chunk with text or a finish reason), the front's TTFT and the engine's
arrival-to-first-step-end (the server's request log), the client-to-front and
front-outside-the-engine differences, and how many first chunks had empty text. One JSON
object per request to ``--out``.

    flock /work/bench.lock nice -n -5 python scripts/sim-timeline/hop.py --out /tmp/hop.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from loraplex.bench.serve.driver import DriveConfig, prompt_ids, replay_over_http
from loraplex.bench.sim.calibrate_loads import into_slots
from loraplex.bench.sim.calibrate_target import self_target
from loraplex.bench.sse_client import StreamingPost
from loraplex.bench.workloads import TraceRequest


async def one(url: str, key: str, model: str, ids: list[int], max_tokens: int) -> dict[str, Any]:
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    start = time.monotonic()
    first_chunk = counted = None
    first_text = None
    headers = {"Authorization": f"Bearer {key}"}
    async with StreamingPost(url, "/v1/completions", body, headers) as post:
        async for line in post.lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if not chunk.get("choices"):
                continue
            now = time.monotonic()
            choice = chunk["choices"][0]
            if first_chunk is None:
                first_chunk, first_text = now, choice.get("text") or ""
            if counted is None and (choice.get("text") or choice.get("finish_reason")):
                counted = now
    return {
        "max_tokens": max_tokens,
        "first_chunk_ms": None if first_chunk is None else (first_chunk - start) * 1e3,
        "driver_ttft_ms": None if counted is None else (counted - start) * 1e3,
        "first_text_empty": first_text == "",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=30)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--gap-s", type=float, default=0.3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    asset_dir = Path(".loraplex-assets")
    rows: list[dict[str, Any]] = []
    with self_target(asset_dir, (8, 64), 1, 4, 0) as target:
        adapter = min(target.adapters, key=lambda a: a.rank)
        admin = {"Authorization": f"Bearer {target.admin_key}"}
        with httpx.Client(base_url=target.url, headers=admin, timeout=60) as client:
            into_slots(client, target.adapters, (adapter,))
        rng = random.Random(0)
        key = target.keys[adapter.tenant]
        prompts = [
            prompt_ids(rng, args.prompt_tokens, target.vocab_size) for _ in range(args.prompts)
        ]
        # Lone requests one after another (as sim calibrate sends them), each prompt with
        # max_tokens 1 and --max-tokens (ABBA), then the same after --gap-s of idleness.
        for group, gap in (("back-to-back", 0.0), ("idle", args.gap_s)):
            for i, ids in enumerate(prompts):
                order = (1, args.max_tokens) if i % 2 == 0 else (args.max_tokens, 1)
                for n in order:
                    time.sleep(gap)
                    row = asyncio.run(one(target.url, key, adapter.name, ids, n))
                    rows.append({"group": group, "prompt": i, **row})
        # The same requests as bench sim replays a trace: scheduled arrivals --gap-s apart.
        requests = [
            TraceRequest(args.gap_s * (i + 1), adapter.tenant, adapter.name, args.prompt_tokens, n)
            for i in range(args.prompts)
            for n in (args.max_tokens,)
        ]
        drive = DriveConfig(vocab_size=target.vocab_size, seed=1)
        records, _ = asyncio.run(
            replay_over_http(target.url, requests, target.keys, target.admin_key, drive)
        )
        for i, rec in enumerate(records):
            ttft = None if rec.ttft_s is None else rec.ttft_s * 1e3
            rows.append(
                {
                    "group": "replay",
                    "prompt": i,
                    "max_tokens": args.max_tokens,
                    "first_chunk_ms": None,
                    "driver_ttft_ms": ttft,
                    "first_text_empty": None,
                }
            )
        assert target.request_log is not None
        logged = [json.loads(x) for x in target.request_log.read_text().splitlines()]
    logged.sort(key=lambda x: x["t_s"])
    for row, line in zip(rows, logged, strict=True):  # sequential: log order is send order
        engine = line.get("engine") or {}
        row["front_ttft_ms"] = None if line["ttft_s"] is None else line["ttft_s"] * 1e3
        fse = engine.get("first_step_end_s")
        row["engine_ms"] = None if fse is None else fse * 1e3
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for group in ("back-to-back", "idle", "replay"):
        for n in (1, args.max_tokens):
            part = [r for r in rows if r["group"] == group and r["max_tokens"] == n]
            if not part:
                continue
            out: dict[str, Any] = {"group": group, "max_tokens": n, "n": len(part)}
            for k in ("driver_ttft_ms", "first_chunk_ms", "front_ttft_ms", "engine_ms"):
                values = [r[k] for r in part if r[k] is not None]
                out[k] = round(statistics.median(values), 2) if values else None
            pairs = [
                r["driver_ttft_ms"] - r["front_ttft_ms"]
                for r in part
                if r["driver_ttft_ms"] and r["front_ttft_ms"]
            ]
            out["client_to_front_ms"] = round(statistics.median(pairs), 2) if pairs else None
            pairs = [
                r["front_ttft_ms"] - r["engine_ms"]
                for r in part
                if r["engine_ms"] and r["front_ttft_ms"]
            ]
            out["front_out_of_engine_ms"] = round(statistics.median(pairs), 2) if pairs else None
            out["first_text_empty"] = sum(bool(r["first_text_empty"]) for r in part)
            sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
