#!/usr/bin/env python3
"""A tenant's cancellation storm against adapter loads and ``auto`` mode transitions: is anything
leaked afterwards (leases, slots, loads in flight, KV blocks, engine requests, connections), and
do another tenant's greedy answers stay what they were?

Against one ``loraplex serve --mode auto`` with few GPU slots (``--max-loras 4``). For
``--seconds``: ``--hog`` hostile workers stream one adapter (``--hog-model``, ``max_tokens`` 64,
``ignore_eos``) so that ``auto`` merges it, closing ``--cancel`` of their streams after 0..8
chunks; ``--churn`` hostile workers cycle through every revision the tenant has (pinned
``name@revision``: more revisions than slots, so each asks for a load) and close each stream
right after its headers or its first chunk (a cancellation while the adapter loads). The
victim sends one greedy completion (``max_tokens`` 16) every ``--victim-gap-s``, compared with
its answer before the storm. ``/metrics`` is read every second (``loraplex_mode_merged``, the
transitions). After ``--quiet-s`` of quiet, the admin views are read: residency entries with a
non-zero ``refcount``, ``adapter_loads_in_flight``, engine requests running or waiting, KV cache
use, connections. One JSON line:

    scripts/attacks/attack24/cancel-storm.py --url http://127.0.0.1:18241 --admin-key "$ADMIN" \\
        --hostile-key "$ACME" --victim-key "$GLOBEX" --seconds 90
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from collections import Counter
from typing import Any

import httpx

HOSTILE_REVISIONS = [
    "support@r1",
    "support@r2",
    "billing@r1",
    "legal@r1",
    "triage@r1",
]
VICTIM_PROMPTS = ["The globex search", "Where is the tree", "hello there"]
GAUGES = (
    "loraplex_mode_merged",
    "adapter_loads_in_flight",
    'engine_requests{state="running"}',
    'engine_requests{state="waiting"}',
    "vllm:kv_cache_usage_perc",
    'loraplex_connections{state="held"}',
    'loraplex_connections{state="authenticated"}',
    'loraplex_mode_transition_seconds_count{direction="merge"}',
    'loraplex_mode_transition_seconds_count{direction="unmerge"}',
)


def gauges(text: str) -> dict[str, float]:
    found = {}
    for line in text.splitlines():
        for name in GAUGES:
            if line.startswith(name + " "):
                found[name] = float(line.rsplit(" ", 1)[1])
    return found


async def stream_and_close(
    client: httpx.AsyncClient, key: str, body: dict[str, Any], after: int | None, out: Counter
) -> None:
    """Stream ``body``; close the connection after ``after`` chunks (None: read to the end)."""
    headers = {"Authorization": f"Bearer {key}"}
    try:
        async with client.stream("POST", "/v1/completions", json=body, headers=headers) as reply:
            if reply.status_code != 200:
                await reply.aread()
                out[f"{reply.status_code}"] += 1
                return
            chunks = 0
            if after == 0:
                out["closed after headers"] += 1
                return
            async for line in reply.aiter_lines():
                if line.startswith("data: {"):
                    chunks += 1
                    if '"error"' in line[:20]:
                        out["stream error"] += 1
                if after is not None and chunks >= after:
                    out["closed mid-stream"] += 1
                    return
            out["read to the end"] += 1
    except httpx.HTTPError as exc:
        out[type(exc).__name__] += 1


async def hog(args: argparse.Namespace, seed: int, end: float, out: Counter) -> None:
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(base_url=args.url, timeout=120) as client:
        while loop.time() < end:
            body = {
                "model": args.hog_model,
                "prompt": "The acme billing desk",
                "max_tokens": 64,
                "ignore_eos": True,
                "stream": True,
                "temperature": 1.0,
            }
            after = rng.randint(0, 8) if rng.random() < args.cancel else None
            await stream_and_close(client, args.hostile_key, body, after, out)


async def churn(args: argparse.Namespace, seed: int, end: float, out: Counter) -> None:
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(base_url=args.url, timeout=120) as client:
        while loop.time() < end:
            body = {
                "model": rng.choice(HOSTILE_REVISIONS),
                "prompt": "x",
                "max_tokens": 32,
                "stream": True,
            }
            await stream_and_close(client, args.hostile_key, body, rng.choice([0, 1]), out)


async def victim_answer(client: httpx.AsyncClient, key: str, model: str, prompt: str) -> list[str]:
    body = {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0, "logprobs": 1}
    got = await client.post(
        "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    )
    got.raise_for_status()
    return got.json()["choices"][0]["logprobs"]["tokens"]


async def victim(args: argparse.Namespace, end: float, result: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(base_url=args.url, timeout=120) as client:
        base = {
            p: await victim_answer(client, args.victim_key, args.victim_model, p)
            for p in VICTIM_PROMPTS
        }
        i = 0
        while loop.time() < end:
            prompt = VICTIM_PROMPTS[i % len(VICTIM_PROMPTS)]
            i += 1
            try:
                got = await victim_answer(client, args.victim_key, args.victim_model, prompt)
                result["answers"] += 1
                result["changed"] += got != base[prompt]
            except httpx.HTTPError as exc:
                result["failed"].append(type(exc).__name__ + " " + str(exc)[:120])
            await asyncio.sleep(args.victim_gap_s)


async def watch(args: argparse.Namespace, end: float, seen: dict[str, float]) -> None:
    loop = asyncio.get_running_loop()
    admin = {"Authorization": f"Bearer {args.admin_key}"}
    async with httpx.AsyncClient(base_url=args.url, timeout=60) as client:
        while loop.time() < end:
            found = gauges((await client.get("/metrics", headers=admin)).text)
            for name, value in found.items():
                seen[name] = max(seen.get(name, value), value)
            await asyncio.sleep(1.0)


async def after_quiet(args: argparse.Namespace) -> dict[str, Any]:
    admin = {"Authorization": f"Bearer {args.admin_key}"}
    async with httpx.AsyncClient(base_url=args.url, timeout=60) as client:
        entries = (await client.get("/admin/residency", headers=admin)).json()["entries"]
        text = (await client.get("/metrics", headers=admin)).text
    held = [f"{e['tier']} {e['model']} refcount {e['refcount']}" for e in entries if e["refcount"]]
    slots = sorted(e["slot"] for e in entries if e["tier"] == "L0")
    return {"held_entries": held, "l0_slots": slots, "gauges": gauges(text)}


async def main_async(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + args.seconds
    out: Counter = Counter()
    victim_result: dict[str, Any] = {"answers": 0, "changed": 0, "failed": []}
    peak: dict[str, float] = {}
    jobs = [hog(args, i, end, out) for i in range(args.hog)]
    jobs += [churn(args, 100 + i, end, out) for i in range(args.churn)]
    jobs += [victim(args, end, victim_result), watch(args, end, peak)]
    await asyncio.gather(*jobs)
    await asyncio.sleep(args.quiet_s)
    line = {
        "name": "cancel-storm",
        "url": args.url,
        "seconds": args.seconds,
        "hostile": dict(sorted(out.items())),
        "victim": victim_result,
        "peak_during": peak,
        "after_quiet": await after_quiet(args),
    }
    sys.stdout.write(json.dumps(line) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--admin-key", required=True)
    parser.add_argument("--hostile-key", required=True)
    parser.add_argument("--victim-key", required=True)
    parser.add_argument("--hog-model", default="billing")
    parser.add_argument("--victim-model", default="search")
    parser.add_argument("--seconds", type=float, default=90)
    parser.add_argument("--hog", type=int, default=6)
    parser.add_argument("--churn", type=int, default=4)
    parser.add_argument("--cancel", type=float, default=0.5)
    parser.add_argument("--victim-gap-s", type=float, default=1.0)
    parser.add_argument("--quiet-s", type=float, default=5.0)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
