#!/usr/bin/env python3
"""Seeded and greedy answers, with logprobs, echo, n, best_of and stop, on an unmerged server
and on a server with one revision merged (``--mode merged:<ref>``): does a tenant's answer
depend on whether another tenant's revision is merged?

Both servers serve the same demo set. ``--reference`` runs unmerged, ``--merged`` with
``merged:acme/support@r1`` (or ``--merged-ref``); the merge is waited for (``/metrics``
``loraplex_mode_merged`` 1) before anything is compared. Each case is sent to both, the same
body, and compared: the choices' texts and tokens, and the largest difference of any logprob
(chosen token's, each top alternative's, each echoed prompt token's). Cases: the merged
revision itself (the owner), another tenant's adapter, the base model; greedy and seeded at
temperature 1; completions with ``logprobs`` 5, ``echo``, ``n`` 2, ``best_of`` 3, ``stop``;
chat with ``top_logprobs`` 5. Prints one JSON line:

    scripts/attacks/attack25/seed-merge.py --reference http://127.0.0.1:18251 \\
        --merged http://127.0.0.1:18252 --ref-keys A_ADMIN,A_ACME,A_GLOBEX \\
        --merged-keys M_ADMIN,M_ACME,M_GLOBEX --seeds 20
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

import httpx

BASE = "loraplex-demo-small"
PROMPTS = ["The acme support team", "Where is", "Summarize: the tree helps", "a b c d"]


def logprob_values(choice: dict[str, Any]) -> list[float]:
    lp = choice.get("logprobs") or {}
    values: list[float] = []
    if "token_logprobs" in lp:
        values += [v for v in lp["token_logprobs"] if v is not None]
        for top in lp["top_logprobs"]:
            values += sorted((top or {}).values())
    for entry in lp.get("content") or []:
        values.append(entry["logprob"])
        values += [t["logprob"] for t in entry["top_logprobs"]]
    return values


def tokens(choice: dict[str, Any]) -> list[str]:
    lp = choice.get("logprobs") or {}
    if "tokens" in lp:
        return list(lp["tokens"])
    return [e["token"] for e in lp.get("content") or []]


def text(choice: dict[str, Any]) -> str:
    return choice["text"] if "text" in choice else choice["message"]["content"]


def bodies(seeds: int) -> list[tuple[str, str, dict[str, Any]]]:
    """(who, path, body): who is 'acme' (the merged revision's owner) or 'globex'."""
    out = []
    models = [("acme", "support@r1"), ("acme", "billing"), ("globex", "search"), ("globex", BASE)]
    for seed in range(seeds):
        prompt = PROMPTS[seed % len(PROMPTS)]
        for who, model in models:
            common = {"model": model, "max_tokens": 12, "seed": seed}
            out.append(
                (
                    who,
                    "/v1/completions",
                    common
                    | {
                        "prompt": prompt,
                        "temperature": 1.0,
                        "logprobs": 5,
                        "echo": True,
                        "n": 2,
                        "best_of": 3,
                        "stop": [" zz"],
                    },
                )
                + "\n"
            )
            out.append(
                (
                    who,
                    "/v1/completions",
                    common | {"prompt": prompt, "temperature": 0.0, "logprobs": 5},
                )
            )
            out.append(
                (
                    who,
                    "/v1/chat/completions",
                    common
                    | {
                        "messages": [{"role": "user", "content": prompt}],
                        "temperature": 1.0,
                        "logprobs": True,
                        "top_logprobs": 5,
                    },
                )
                + "\n"
            )
    return out


def wait_merged(client: httpx.Client, admin: str, timeout_s: float = 120) -> float:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        got = client.get("/metrics", headers={"Authorization": f"Bearer {admin}"}).text
        for line in got.splitlines():
            if line.startswith("loraplex_mode_merged ") and float(line.split()[1]) == 1.0:
                return float(line.split()[1])
        time.sleep(1)
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reference", required=True)
    parser.add_argument("--merged", required=True)
    parser.add_argument("--ref-keys", required=True, help="admin,acme,globex")
    parser.add_argument("--merged-keys", required=True, help="admin,acme,globex")
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    ref = httpx.Client(base_url=args.reference, timeout=120)
    mer = httpx.Client(base_url=args.merged, timeout=120)
    rkeys = dict(zip(("admin", "acme", "globex"), args.ref_keys.split(","), strict=True))
    mkeys = dict(zip(("admin", "acme", "globex"), args.merged_keys.split(","), strict=True))
    warm = {"model": "support@r1", "prompt": "The acme support team", "max_tokens": 2}
    mer.post("/v1/completions", json=warm, headers={"Authorization": f"Bearer {mkeys['acme']}"})
    merged = wait_merged(mer, mkeys["admin"])
    compared = 0
    text_differ: list[str] = []
    token_differ: list[str] = []
    failed: list[str] = []
    worst = 0.0
    per_model_worst: dict[str, float] = {}
    for who, path, body in bodies(args.seeds):
        a = ref.post(path, json=body, headers={"Authorization": f"Bearer {rkeys[who]}"})
        b = mer.post(path, json=body, headers={"Authorization": f"Bearer {mkeys[who]}"})
        label = (
            f"{who} {body['model']} {path.rsplit('/', 1)[1]} t={body['temperature']} "
            f"seed={body['seed']}"
        )
        if a.status_code != 200 or b.status_code != 200:
            failed.append(f"{label}: {a.status_code} {b.status_code} {b.text[:120]}")
            continue
        compared += 1
        ca, cb = a.json()["choices"], b.json()["choices"]
        if [text(c) for c in ca] != [text(c) for c in cb]:
            text_differ.append(label)
        if [tokens(c) for c in ca] != [tokens(c) for c in cb]:
            token_differ.append(label)
            continue
        for x, y in zip(ca, cb, strict=True):
            va, vb = logprob_values(x), logprob_values(y)
            if len(va) != len(vb):
                token_differ.append(label + " (logprob count)")
                break
            for p, q in zip(va, vb, strict=True):
                if p <= -9999 or q <= -9999:
                    continue
                d = abs(p - q) if math.isfinite(p) and math.isfinite(q) else math.inf
                worst = max(worst, d)
                per_model_worst[body["model"]] = max(per_model_worst.get(body["model"], 0.0), d)
    sys.stdout.write(
        json.dumps(
            {
                "name": "seed-merge",
                "reference": args.reference,
                "merged": args.merged,
                "merged_gauge": merged,
                "compared": compared,
                "text_differ": len(text_differ),
                "token_differ": len(token_differ),
                "first_differ": (text_differ + token_differ)[:6],
                "max_logprob_diff": worst,
                "max_logprob_diff_by_model": {k: round(v, 7) for k, v in per_model_worst.items()},
                "failed": failed[:6],
            }
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
