#!/usr/bin/env python3
"""A tenant cancels fanned-out requests: ``n`` / ``best_of`` up to 16, batches of prompts, long
echoed prompts with prompt logprobs (their prefill skips the prefix cache), on both endpoints,
streamed and closed after 0..2 chunks, or not streamed and dropped by a client timeout of
0..``--max-drop-ms``. Is anything left held afterwards (engine requests, KV blocks, leases,
loads, connections), and do another tenant's greedy answers stay the same?

The victim's loop and the ``/metrics`` / ``/admin/residency`` readings are attack24's
(``scripts/attacks/attack24/cancel-storm.py``). One JSON line:

    scripts/attacks/attack25/fanout-cancel.py --url http://127.0.0.1:18251 --admin-key "$ADMIN" \\
        --hostile-key "$ACME" --victim-key "$GLOBEX" --seconds 90
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

_STORM = Path(__file__).resolve().parents[1] / "attack24" / "cancel-storm.py"
_spec = importlib.util.spec_from_file_location("cancel_storm", _STORM)
assert _spec is not None and _spec.loader is not None
storm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(storm)

MODELS = ["support", "billing", "legal@r1", "triage", "loraplex-demo-small"]
LONG = " ".join(["the tree helps the acme support team"] * 40)  # ~300 tokens


def draw(rng: random.Random) -> tuple[str, dict[str, Any]]:
    chat = rng.random() < 0.3
    body: dict[str, Any] = {
        "model": rng.choice(MODELS),
        "max_tokens": rng.randint(8, 48),
        "temperature": rng.choice([0.0, 1.0]),
        "seed": rng.randint(0, 1000),
        "stream": rng.random() < 0.6,
    }
    if chat:
        body["messages"] = [{"role": "user", "content": rng.choice([LONG, "hello"])}]
        body["n"] = rng.choice([4, 8, 16])
        body["logprobs"] = True
        body["top_logprobs"] = 20
        return "/v1/chat/completions", body
    shape = rng.random()
    if shape < 0.4:
        body["prompt"] = LONG
        body["n"] = rng.choice([4, 16])
        body["echo"] = True
        body["logprobs"] = 20
        body["max_tokens"] = rng.randint(1, 24)
    elif shape < 0.7:
        body["prompt"] = [LONG[: rng.randint(20, 400)] for _ in range(4)]
        body["n"] = 4
    else:
        body["prompt"] = LONG
        body["n"] = rng.choice([1, 2])
        body["best_of"] = 16 if not body["stream"] else body["n"]
    return "/v1/completions", body


async def one(
    client: httpx.AsyncClient, args: argparse.Namespace, rng: random.Random, out: Counter
) -> None:
    path, body = draw(rng)
    headers = {"Authorization": f"Bearer {args.hostile_key}"}
    if body["stream"]:
        after = rng.choice([0, 1, 2, None]) if rng.random() < args.cancel else None
        try:
            async with client.stream("POST", path, json=body, headers=headers) as reply:
                if reply.status_code != 200:
                    await reply.aread()
                    out[f"stream {reply.status_code}"] += 1
                    return
                if after == 0:
                    out["closed after headers"] += 1
                    return
                chunks = 0
                async for line in reply.aiter_lines():
                    if line.startswith("data: {"):
                        chunks += 1
                    if after is not None and chunks >= after:
                        out["closed mid-stream"] += 1
                        return
                out["stream read to the end"] += 1
        except httpx.HTTPError as exc:
            out[type(exc).__name__] += 1
        return
    drop = rng.random() < args.cancel
    timeout = rng.uniform(0.0, args.max_drop_ms / 1000) if drop else 120.0
    try:
        got = await client.post(path, json=body, headers=headers, timeout=timeout)
        out[f"answered {got.status_code}"] += 1
    except httpx.TimeoutException:
        out["dropped by timeout"] += 1
    except httpx.HTTPError as exc:
        out[type(exc).__name__] += 1


async def worker(args: argparse.Namespace, seed: int, end: float, out: Counter) -> None:
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(base_url=args.url, timeout=120) as client:
        while loop.time() < end:
            await one(client, args, rng, out)


async def main_async(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + args.seconds
    out: Counter = Counter()
    victim_result: dict[str, Any] = {"answers": 0, "changed": 0, "failed": []}
    peak: dict[str, float] = {}
    jobs = [worker(args, args.seed + i, end, out) for i in range(args.workers)]
    jobs += [storm.victim(args, end, victim_result), storm.watch(args, end, peak)]
    await asyncio.gather(*jobs)
    await asyncio.sleep(args.quiet_s)
    line = {
        "name": "fanout-cancel",
        "url": args.url,
        "seconds": args.seconds,
        "workers": args.workers,
        "hostile": dict(sorted(out.items())),
        "victim": victim_result,
        "peak_during": peak,
        "after_quiet": await storm.after_quiet(args),
    }
    sys.stdout.write(json.dumps(line) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--admin-key", required=True)
    parser.add_argument("--hostile-key", required=True)
    parser.add_argument("--victim-key", required=True)
    parser.add_argument("--victim-model", default="search")
    parser.add_argument("--victim-gap-s", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--cancel", type=float, default=0.6)
    parser.add_argument("--max-drop-ms", type=float, default=300.0)
    parser.add_argument("--quiet-s", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=25)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
