#!/usr/bin/env python3
"""Does ``auto``'s merge move a caller's charge onto the owner of a public adapter?

A copy is charged to the tenant whose request loaded it, and only the owner's own ask should
move that charge to the owner (docs/registry.md, "Resolution"). ``auto`` merges the revision
that carries most tokens and asks the cache for a lease on it naming no tenant; before
attack26 an ask naming no tenant moved the charge like the owner's ask. A tenant (acme) that
makes another tenant's public adapter (``globex/search``) the hottest revision therefore has
its GPU copy handed to globex's share, where the merge's lease keeps it for as long as acme's
traffic keeps it merged, and globex's own adapters get one slot of its share fewer.

Against one ``loraplex serve --mode auto --max-loras 4`` on the demo set (default
``default_tenant_tier_share`` 0.5: two GPU slots per tenant). The script makes
``globex/search`` public with the admin key, then for ``--seconds``: ``--workers`` acme
clients send ``globex/search`` (``--hot-tokens`` each, so it carries most tokens) and one acme
client cycles acme's own ``--own-models`` (1 token each, so they keep acme's two slots);
globex cycles ``--owner-models`` with one sequential client. Every ``--sample-s`` it reads
``/admin/residency`` and ``/metrics``. Counted: globex's answers by the ``loraplex.tier`` they
were leased from (L0: a GPU hit), the samples in which ``loraplex_mode_merged`` was 1, and
among those the samples in which search's L0 copy was charged to globex (``charged_to``).
Counts, not timings: not under the bench lock. One JSON line:

    scripts/attacks/attack26/merge-charge.py --url http://127.0.0.1:18261 --admin-key "$ADMIN" \\
        --attacker-key "$ACME" --owner-key "$GLOBEX"
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

# attack25's client loop (one model after another, answers counted by their ``loraplex.tier``)
_SQUAT = Path(__file__).resolve().parents[1] / "attack25" / "public-squat.py"
_spec = importlib.util.spec_from_file_location("public_squat", _SQUAT)
assert _spec is not None and _spec.loader is not None
squat = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(squat)

PUBLIC = "globex/search"


def gauge(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


async def sampler(
    client: httpx.AsyncClient, admin: str, end: float, every_s: float, samples: list[dict]
) -> None:
    loop = asyncio.get_running_loop()
    headers = {"Authorization": f"Bearer {admin}"}
    while loop.time() < end:
        got = await client.get("/admin/residency", headers=headers)
        metrics = await client.get("/metrics", headers=headers)
        if got.status_code != 200 or metrics.status_code != 200:
            samples.append({"failed": [got.status_code, metrics.status_code, got.text[:200]]})
            await asyncio.sleep(every_s)
            continue
        residency, metrics_text = got.json(), metrics.text
        l0 = [e for e in residency["entries"] if e["tier"] == "L0"]
        by_tenant = Counter(e.get("charged_to") for e in l0)
        search = [e for e in l0 if e["model"].startswith(PUBLIC + "@")]
        samples.append(
            {
                "merged": gauge(metrics_text, "loraplex_mode_merged"),
                "search_charged_to": search[0].get("charged_to") if search else None,
                "l0_slots_by_charge": dict(by_tenant),
            }
        )
        await asyncio.sleep(every_s)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    admin = {"Authorization": f"Bearer {args.admin_key}"}
    async with httpx.AsyncClient(base_url=args.url, timeout=120) as client:
        got = await client.put(
            f"/admin/adapters/{PUBLIC}/visibility", json={"visibility": "public"}, headers=admin
        )
        got.raise_for_status()
        loop = asyncio.get_running_loop()
        end = loop.time() + args.seconds
        owner: Counter = Counter()
        hot: Counter = Counter()
        own: Counter = Counter()
        samples: list[dict] = []
        loop_models = squat.loop_models
        jobs = [
            loop_models(client, args.owner_key, args.owner_models.split(","), end=end,
                        tiers=owner, gap_s=args.owner_gap_s, offset=0, ignore_eos=True),
            loop_models(client, args.attacker_key, args.own_models.split(","), end=end,
                        tiers=own, gap_s=0.0, offset=0, max_tokens=1, ignore_eos=True),
            sampler(client, args.admin_key, end, args.sample_s, samples),
        ]  # fmt: skip
        jobs += [
            loop_models(client, args.attacker_key, [PUBLIC], end=end, tiers=hot, gap_s=0.0,
                        offset=0, max_tokens=args.hot_tokens, ignore_eos=True)
            for _ in range(args.workers)
        ]  # fmt: skip
        load_start = os.getloadavg()[0]
        await asyncio.gather(*jobs)
        residency = (await client.get("/admin/residency", headers=admin)).json()
    failed = [s["failed"] for s in samples if "failed" in s]
    samples = [s for s in samples if "failed" not in s]
    merged = [s for s in samples if s["merged"] == 1.0]
    owner_leased = sum(v for k, v in owner.items() if k.startswith("L") or k == "None")
    return {
        "name": "merge-charge",
        "url": args.url,
        "seconds": args.seconds,
        "load": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "owner_tiers": dict(sorted(owner.items())),
        "owner_l0_share": round(owner.get("L0", 0) / owner_leased, 3) if owner_leased else None,
        "attacker_search_answers": sum(hot.values()),
        "attacker_own_answers": sum(own.values()),
        "samples": len(samples),
        "samples_failed": failed[:3],
        "samples_merged": len(merged),
        "merged_search_charged_to": dict(Counter(str(s["search_charged_to"]) for s in merged)),
        "unmerged_search_charged_to": dict(
            Counter(str(s["search_charged_to"]) for s in samples if s["merged"] != 1.0)
        ),
        "last_sample": samples[-1] if samples else None,
        "l0_at_end": sorted(
            f"{e['model']} charged_to={e.get('charged_to')} refs={e.get('refcount')}"
            for e in residency["entries"]
            if e["tier"] == "L0"
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--admin-key", required=True)
    parser.add_argument("--attacker-key", required=True)
    parser.add_argument("--owner-key", required=True)
    parser.add_argument("--owner-models", default="codegen,summarize")
    parser.add_argument("--own-models", default="support,billing")
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--hot-tokens", type=int, default=64)
    parser.add_argument("--owner-gap-s", type=float, default=0.2)
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--sample-s", type=float, default=2.0)
    result = asyncio.run(main_async(parser.parse_args()))
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
