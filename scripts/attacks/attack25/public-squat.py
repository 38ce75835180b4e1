#!/usr/bin/env python3
"""A residency squat through another tenant's public adapter: every cached copy is charged to
its revision's owner (docs/registry.md, "Resolution"), so a tenant that calls the owner's
public adapter instead of one of its own moves that copy's GPU room from its own share to the
owner's. Does the owner's own traffic then find its adapters in L0 less often?

Against one ``loraplex serve --max-loras 4`` (default ``default_tenant_tier_share`` 0.5: two
GPU slots per tenant) with ``globex/search`` made public (this script does it with the admin
key). Phases alternate A B B A (``--phases``), ``--phase-s`` each, separated by
``--settle-s`` of quiet: in both the owner (globex) cycles through ``--owner-models`` with one
sequential client; the attacker (acme, ``--workers`` clients) cycles through ``--own-models``
plus, in A, one more of its own (``--fourth``), in B the owner's public adapter
(``globex/search``); in O the attacker sends nothing (how long the owner takes to get its
slots back). Counted per phase: the owner's answers by the ``loraplex.tier`` they were
leased from (``L0`` a GPU hit; anything else a load), and the attacker's answers. Not a timing
(counts of tiers), so not under the bench lock; load averages are printed. One JSON line:

    scripts/attacks/attack25/public-squat.py --url http://127.0.0.1:18251 --admin-key "$ADMIN" \\
        --attacker-key "$ACME" --owner-key "$GLOBEX"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections import Counter
from typing import Any

import httpx


async def loop_models(
    client: httpx.AsyncClient,
    key: str,
    models: list[str],
    *,
    end: float,
    tiers: Counter,
    gap_s: float,
    offset: int,
    max_tokens: int = 4,
    ignore_eos: bool = False,
) -> None:
    loop = asyncio.get_running_loop()
    i = offset
    headers = {"Authorization": f"Bearer {key}"}
    while loop.time() < end:
        model = models[i % len(models)]
        i += 1
        body = {"model": model, "prompt": "hello there", "max_tokens": max_tokens, "temperature": 0}
        if ignore_eos:  # attack26's merge-charge.py: every answer max_tokens long
            body["ignore_eos"] = True
        try:
            got = await client.post("/v1/completions", json=body, headers=headers)
        except httpx.HTTPError as exc:
            tiers[type(exc).__name__] += 1
            continue
        if got.status_code != 200:
            tiers[f"status {got.status_code}"] += 1
            continue
        tier = got.json()["loraplex"].get("tier")
        tiers[str(tier)] += 1
        if gap_s:
            await asyncio.sleep(gap_s)


async def phase(args: argparse.Namespace, kind: str) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    end = loop.time() + args.phase_s
    extra = args.fourth if kind == "A" else "globex/search"
    attacker_models = [*args.own_models.split(","), extra]
    workers = 0 if kind == "O" else args.workers  # O: the owner alone (the attacker idle)
    owner: Counter = Counter()
    attacker: Counter = Counter()
    async with httpx.AsyncClient(base_url=args.url, timeout=120) as client:
        jobs = [
            loop_models(
                client,
                args.owner_key,
                args.owner_models.split(","),
                end=end,
                tiers=owner,
                gap_s=args.owner_gap_s,
                offset=0,
            )
        ]
        jobs += [
            loop_models(
                client,
                args.attacker_key,
                attacker_models,
                end=end,
                tiers=attacker,
                gap_s=0.0,
                offset=w,
            )
            for w in range(workers)
        ]
        await asyncio.gather(*jobs)
        residency = await client.get(
            "/admin/residency", headers={"Authorization": f"Bearer {args.admin_key}"}
        )
    l0 = sorted(e["model"] for e in residency.json()["entries"] if e["tier"] == "L0")
    total = sum(v for k, v in owner.items() if k.startswith("L") or k == "None")
    return {
        "phase": kind,
        "owner_tiers": dict(sorted(owner.items())),
        "owner_l0_share": round(owner.get("L0", 0) / total, 3) if total else None,
        "attacker_answers": sum(attacker.values()),
        "attacker_tiers": dict(sorted(attacker.items())),
        "l0_at_end": l0,
    }


async def main_async(args: argparse.Namespace) -> None:
    async with httpx.AsyncClient(base_url=args.url, timeout=60) as client:
        got = await client.put(
            "/admin/adapters/globex/search/visibility",
            json={"visibility": "public"},
            headers={"Authorization": f"Bearer {args.admin_key}"},
        )
        got.raise_for_status()
    results = []
    load_start = os.getloadavg()[0]
    for kind in args.phases.split(","):
        results.append(await phase(args, kind))
        await asyncio.sleep(args.settle_s)
    sys.stdout.write(
        json.dumps(
            {
                "name": "public-squat",
                "url": args.url,
                "phase_s": args.phase_s,
                "workers": args.workers,
                "load": [round(load_start, 2), round(os.getloadavg()[0], 2)],
                "phases": results,
            }
        )
        + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--admin-key", required=True)
    parser.add_argument("--attacker-key", required=True)
    parser.add_argument("--owner-key", required=True)
    parser.add_argument("--owner-models", default="codegen,summarize,translate")
    parser.add_argument("--own-models", default="support,billing,legal")
    parser.add_argument("--fourth", default="triage")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--owner-gap-s", type=float, default=0.2)
    parser.add_argument("--phase-s", type=float, default=40.0)
    parser.add_argument("--settle-s", type=float, default=3.0)
    parser.add_argument("--phases", default="A,B,B,A")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
