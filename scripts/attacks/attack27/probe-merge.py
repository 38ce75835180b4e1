#!/usr/bin/env python3
"""Do a release's output probes drive ``auto``'s merge decision?

``auto`` merges the revision that carries most of the engine's recent tokens (docs/modes.md).
A release's probes run on the engine (``serve/release_env.py``) before any tenant traffic
reaches the candidate. If their tokens count in ``auto``'s window, an operator's release of one
tenant's adapter (with the probes the tenant handed over) merges the unproven candidate into the
base weights that every other tenant's requests then run on (their tokens through the merged
path, the delta subtracted), and the candidate's pins outlive a failed release while it stays
merged.

Against one ``loraplex serve --mode auto`` on the demo set: a victim (globex) sends small
completions of ``search`` one after another; after ``--warm-s`` the script starts a release of
``acme/support@r2`` through the admin API with ``--probes`` probes of ``--prompt-chars``
characters and ``--probe-tokens`` tokens each, whose ``expected`` never matches (the release
is rolled back once they are done). Every 0.5 s it reads ``/metrics`` (``loraplex_mode_merged``,
merge transitions) and the release's state. Counts, not timings. One JSON line:

    scripts/attacks/attack27/probe-merge.py --url http://127.0.0.1:18271 --admin-key "$ADMIN" \\
        --victim-key "$GLOBEX"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path

import httpx


def gauge(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


async def victim(
    client: httpx.AsyncClient, key: str, end: float, out: Counter, waits: list[float]
) -> None:
    while time.monotonic() < end:
        body = {"model": "search", "prompt": "The globex search index", "max_tokens": 2}
        t0 = time.monotonic()
        r = await client.post(
            "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        )
        waits.append(time.monotonic() - t0)
        out[f"status {r.status_code}"] += 1
        await asyncio.sleep(0.2)


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--admin-key", required=True)
    p.add_argument("--victim-key", required=True)
    p.add_argument("--probes", type=int, default=32)
    p.add_argument("--prompt-chars", type=int, default=1200)
    p.add_argument("--probe-tokens", type=int, default=100)
    p.add_argument("--warm-s", type=float, default=20.0)
    p.add_argument("--seconds", type=float, default=90.0)
    p.add_argument("--candidate", default="acme/support@r2")
    p.add_argument(
        "--via-cli",
        metavar="DATA_DIR",
        help="start it with `loraplex release start "
        "--probe-file` on this data directory (no bounds there) instead of the admin API",
    )
    a = p.parse_args()
    admin = {"Authorization": f"Bearer {a.admin_key}"}
    tenant_name, revision = a.candidate.split("@")
    tenant, name = tenant_name.split("/")
    samples: list[dict] = []
    victims: Counter = Counter()
    waits: list[float] = []
    async with httpx.AsyncClient(base_url=a.url, timeout=60) as client:
        start = time.monotonic()
        end = start + a.seconds
        task = asyncio.create_task(victim(client, a.victim_key, end, victims, waits))
        await asyncio.sleep(a.warm_s)
        text = ("The acme support team answers every ticket " * 100)[: a.prompt_chars]
        probes = [
            {"prompt": f"{i} {text}", "expected": "never this", "max_tokens": a.probe_tokens}
            for i in range(a.probes)
        ]
        body = {"tenant": tenant, "name": name, "revision": revision, "probes": probes}
        if a.via_cli:
            path = Path(a.via_cli) / "probes.jsonl"
            path.write_text("".join(json.dumps(probe) + "\n" for probe in probes))
            cmd = [
                sys.executable,
                "-m",
                "loraplex",
                "release",
                "start",
                tenant_name,
                revision,
                "--probe-file",
                str(path),
                "--data-dir",
                a.via_cli,
            ]
            proc = await asyncio.create_subprocess_exec(*cmd, stdout=-1, stderr=-1)
            _, err = await proc.communicate()
            started = {"exit": proc.returncode, "stderr": err.decode()[-200:]}
        else:
            r = await client.post("/admin/releases", json=body, headers=admin)
            started = {
                "status": r.status_code,
                "body": r.text[:200] if r.status_code != 201 else None,
            }
        while time.monotonic() < end:
            m = (await client.get("/metrics", headers=admin)).text
            rel = (await client.get(f"/admin/releases/{tenant}/{name}", headers=admin)).json()
            samples.append(
                {
                    "t": round(time.monotonic() - start, 1),
                    "merged": gauge(m, "loraplex_mode_merged"),
                    "merges": gauge(m, 'loraplex_mode_transition_seconds_count{direction="merge"}'),
                    "state": rel.get("state"),
                }
            )
            await asyncio.sleep(0.5)
        await task
        res = (await client.get("/admin/residency", headers=admin)).json()
    merged_in = Counter(s["state"] for s in samples if s["merged"])
    sys.stdout.write(
        json.dumps(
            {
                "name": "probe-merge",
                "url": a.url,
                "probes": a.probes,
                "prompt_chars": a.prompt_chars,
                "probe_tokens": a.probe_tokens,
                "release_start": started,
                "samples": len(samples),
                "samples_merged_by_state": dict(merged_in),
                "merges_at_end": samples[-1]["merges"] if samples else None,
                "states": [s["state"] for s in samples[:: max(1, len(samples) // 12)]],
                "final_reason": rel.get("reason"),
                "victim": dict(victims),
                "victim_s_max": round(max(waits), 3) if waits else None,
                "victim_s_median": round(sorted(waits)[len(waits) // 2], 3) if waits else None,
                "mode_at_end": res.get("mode") if isinstance(res, dict) else None,
            }
        )
        + "\n"
    )


asyncio.run(main())
