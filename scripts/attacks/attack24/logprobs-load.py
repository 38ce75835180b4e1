#!/usr/bin/env python3
"""Does every requested logprob arrive under load, with some streams cancelled?

Against one ``loraplex serve``: ``--workers`` concurrent clients per key (the hostile tenant's and
the victim's) loop for ``--seconds``, each request drawn from a seeded mix: completions or chat,
streamed or not, ``logprobs`` / ``top_logprobs`` 0..20, ``echo``, ``n`` 1..3, ``best_of``,
``stop``, ``logit_bias``, ``seed``, ``max_tokens`` 1..48, on the tenant's adapters and the base
model. The hostile tenant cancels ``--cancel`` of its streams (closes the connection after a
random number of chunks). Every answer that finished is checked: each choice carries the
logprobs asked for (one entry per token, ``top`` entries of the size asked, tokens adding up to
the usage counts) and a ``finish_reason``. Prints one JSON line with counts by outcome and the
first few violations:

    scripts/attacks/attack24/logprobs-load.py --url http://127.0.0.1:18241 \\
        --hostile-key "$ACME" --victim-key "$GLOBEX" --seconds 60
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

ADAPTERS = {"hostile": ["support", "billing", "legal", "triage"], "victim": ["search", "codegen"]}
BASE = "loraplex-demo-small"
PROMPTS = ["The acme support team", "hello", "Where is", "Summarize: the tree helps", "a b c d"]


def draw(rng: random.Random, role: str) -> tuple[str, dict[str, Any]]:
    """(endpoint, body) of one request."""
    chat = rng.random() < 0.4
    body: dict[str, Any] = {
        "model": rng.choice([*ADAPTERS[role], BASE]),
        "max_tokens": rng.randint(1, 48),
        "temperature": rng.choice([0.0, 0.7, 1.0]),
        "stream": rng.random() < 0.6,
    }
    if rng.random() < 0.5:
        body["seed"] = rng.randint(0, 2**31)
    if rng.random() < 0.3:
        body["stop"] = rng.sample([" the", "e", "\n", "zz"], rng.randint(1, 3))
    if rng.random() < 0.3:
        body["logit_bias"] = {str(rng.randint(0, 599)): rng.uniform(-100, 100) for _ in range(3)}
    if body["stream"]:
        body["stream_options"] = {"include_usage": True}
    n = rng.choice([1, 1, 2, 3])
    if chat:
        body["messages"] = [{"role": "user", "content": rng.choice(PROMPTS)}]
        body["logprobs"] = True
        body["top_logprobs"] = rng.choice([0, 1, 5, 20])
        body["n"] = n
        return "/v1/chat/completions", body
    body["prompt"] = rng.choice(PROMPTS)
    body["logprobs"] = rng.choice([0, 1, 5, 20])
    body["echo"] = rng.random() < 0.3
    body["n"] = n
    if not body["stream"] and rng.random() < 0.2:
        body["best_of"] = n + rng.randint(0, 2)
    return "/v1/completions", body


def top_ok(top: dict[str, float] | None, k: int) -> bool:
    # k alternatives plus the chosen token when it is not among them; a dict keyed by text may
    # merge two tokens of one spelling, so fewer is possible but never more
    if k == 0:
        return top is None or len(top) <= 1
    return top is not None and 1 <= len(top) <= k + 1


def check_completion(body: dict[str, Any], choices: list[dict[str, Any]], usage: Any) -> list[str]:
    k = body["logprobs"]
    problems = []
    tokens_total = 0
    for choice in choices:
        lp = choice.get("logprobs")
        if lp is None:
            problems.append(f"choice {choice.get('index')}: logprobs null")
            continue
        lists = [lp.get(f) for f in ("tokens", "token_logprobs", "top_logprobs", "text_offset")]
        if any(v is None for v in lists) or len({len(v) for v in lists}) != 1:
            problems.append(
                f"choice {choice.get('index')}: list lengths {[len(v or []) for v in lists]}"
            )
            continue
        tokens, values, tops, _ = lists
        for i, (value, top) in enumerate(zip(values, tops, strict=True)):
            if i == 0 and body.get("echo") and value is None:
                continue  # the prompt's first token has no logprob (nothing before it)
            if value is None or not top_ok(top, k):
                problems.append(f"choice {choice.get('index')}: token {i} value {value} top {top}")
                break
        tokens_total += len(tokens)
        if choice.get("finish_reason") is None:
            problems.append(f"choice {choice.get('index')}: finish_reason null")
    counted = usage is not None and not body.get("echo") and not body.get("best_of")
    if counted and tokens_total != usage["completion_tokens"]:
        problems.append(f"tokens {tokens_total} != usage {usage['completion_tokens']}")
    return problems


def check_chat(body: dict[str, Any], choices: list[dict[str, Any]], usage: Any) -> list[str]:
    k = body["top_logprobs"]
    problems = []
    tokens_total = 0
    for choice in choices:
        lp = choice.get("logprobs")
        content = None if lp is None else lp.get("content")
        if content is None:
            problems.append(f"choice {choice.get('index')}: logprobs.content null")
            continue
        for i, entry in enumerate(content):
            if entry.get("logprob") is None or len(entry.get("top_logprobs", [])) != k:
                n_top = len(entry.get("top_logprobs") or [])
                problems.append(f"choice {choice.get('index')}: entry {i} top {n_top} != {k}")
                break
        tokens_total += len(content)
        if choice.get("finish_reason") is None:
            problems.append(f"choice {choice.get('index')}: finish_reason null")
    if usage is not None and tokens_total != usage["completion_tokens"]:
        problems.append(f"tokens {tokens_total} != usage {usage['completion_tokens']}")
    return problems


def merge_stream(chunks: list[dict[str, Any]], chat: bool) -> tuple[list[dict[str, Any]], Any]:
    """Choices rebuilt from a stream's chunks (logprobs concatenated per choice) and its usage."""
    merged: dict[int, dict[str, Any]] = {}
    usage = None
    for chunk in chunks:
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices", []):
            into = merged.setdefault(choice["index"], {"index": choice["index"], "logprobs": None})
            if choice.get("finish_reason") is not None:
                into["finish_reason"] = choice["finish_reason"]
            lp = choice.get("logprobs")
            if lp is None:
                continue
            if chat:
                have = into["logprobs"] or {"content": []}
                have["content"] += lp.get("content") or []
            else:
                have = into["logprobs"] or {f: [] for f in lp}
                for field, values in lp.items():
                    have[field] = have.get(field, []) + (values or [])
            into["logprobs"] = have
    for choice in merged.values():
        choice.setdefault("finish_reason", None)
    return sorted(merged.values(), key=lambda c: c["index"]), usage


async def one(
    client: httpx.AsyncClient,
    rng: random.Random,
    role: str,
    key: str,
    *,
    cancel: float,
    out: Counter,
) -> list[str]:
    path, body = draw(rng, role)
    headers = {"Authorization": f"Bearer {key}"}
    chat = path.endswith("chat/completions")
    check = check_chat if chat else check_completion
    if not body["stream"]:
        reply = await client.post(path, json=body, headers=headers)
        out[f"{role} {reply.status_code}"] += 1
        if reply.status_code != 200:
            return [f"{reply.status_code} {reply.text[:200]}"] if reply.status_code >= 500 else []
        data = reply.json()
        return [
            f"{path} {json.dumps(body)}: {p}" for p in check(body, data["choices"], data["usage"])
        ]
    stop_after = rng.randint(0, 6) if role == "hostile" and rng.random() < cancel else None
    chunks: list[dict[str, Any]] = []
    async with client.stream("POST", path, json=body, headers=headers) as reply:
        if reply.status_code != 200:
            out[f"{role} {reply.status_code}"] += 1
            return []
        done = False
        async for line in reply.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunks.append(json.loads(line[6:]))
            if "error" in chunks[-1]:
                out[f"{role} stream-error"] += 1
                return [f"{path} stream error {chunks[-1]['error']}"]
            if stop_after is not None and len(chunks) >= stop_after:
                out[f"{role} cancelled"] += 1
                return []
    if not done:
        out[f"{role} no-done"] += 1
        return [f"{path} {json.dumps(body)}: stream ended without [DONE]"]
    out[f"{role} 200 stream"] += 1
    choices, usage = merge_stream(chunks, chat)
    if len(choices) != body["n"]:
        return [f"{path} {json.dumps(body)}: {len(choices)} choices of {body['n']}"]
    return [f"{path} {json.dumps(body)}: {p}" for p in check(body, choices, usage)]


async def worker(
    args: argparse.Namespace, role: str, key: str, seed: int, out: Counter
) -> list[str]:
    rng = random.Random(seed)
    problems: list[str] = []
    loop = asyncio.get_running_loop()
    end = loop.time() + args.seconds
    async with httpx.AsyncClient(base_url=args.url, timeout=120) as client:
        while loop.time() < end:
            try:
                problems += await one(client, rng, role, key, cancel=args.cancel, out=out)
            except httpx.HTTPError as exc:
                out[f"{role} {type(exc).__name__}"] += 1
    return problems


async def main_async(args: argparse.Namespace) -> None:
    out: Counter = Counter()
    jobs = [
        worker(args, role, key, args.seed * 1000 + i * 2 + (role == "victim"), out)
        for i in range(args.workers)
        for role, key in (("hostile", args.hostile_key), ("victim", args.victim_key))
    ]
    problems = [p for found in await asyncio.gather(*jobs) for p in found]
    sys.stdout.write(
        json.dumps(
            {
                "name": "logprobs-load",
                "url": args.url,
                "seconds": args.seconds,
                "workers_per_tenant": args.workers,
                "outcomes": dict(sorted(out.items())),
                "violations": len(problems),
                "first_violations": problems[:5],
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--hostile-key", required=True)
    parser.add_argument("--victim-key", required=True)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--cancel", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=24)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
