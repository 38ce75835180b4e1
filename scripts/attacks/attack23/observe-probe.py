#!/usr/bin/env python3
"""What a tenant's strings do to ``/metrics``, the server's log, and which routes its key reaches.

Against one ``loraplex serve``: (1) every GET route of the app's OpenAPI listing (public and
admin, read with the admin key) is requested with the tenant's key and with no key, and the
status noted; (2) ``--names`` completions with distinct tenant-chosen strings in ``model``,
``user``, ``X-Request-Id``, ``X-Session-Id``, ``traceparent`` and ``User-Agent`` (with newlines,
ANSI escapes and 200-character tails), and the count of ``/metrics`` series before and after;
(3) the lines the server's log (``--log``) gained, checked for a raw newline-split or ANSI
escape of the tenant's strings, and for the other tenant's adapter names. Prints one JSON line:

    scripts/attacks/attack23/observe-probe.py --url http://127.0.0.1:18232 \\
        --admin-key "$ADMIN_KEY" --key "$ACME_KEY" --log /tmp/serve.log
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import httpx

EVIL = "x\n2026-12-07 00:00:00,000 INFO forged line \x1b[31mred\x1b[0m"


def series(client: httpx.Client, admin: str) -> set[str]:
    text = client.get("/metrics", headers={"Authorization": f"Bearer {admin}"}).text
    return {
        line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--admin-key", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--names", type=int, default=300)
    parser.add_argument("--victim-names", default="search,codegen,summarize,translate,chat,extract")
    args = parser.parse_args()
    client = httpx.Client(base_url=args.url, timeout=60)
    admin = {"Authorization": f"Bearer {args.admin_key}"}
    tenant = {"Authorization": f"Bearer {args.key}"}
    routes = {}
    spec = {}
    for path in ("/openapi.json", "/admin/openapi.json"):
        got = client.get(path, headers=admin)
        if got.status_code == 200:
            spec.update(got.json().get("paths", {}))
    for path, methods in sorted(spec.items()):
        if "get" not in methods or "{" in path:
            continue
        routes[path] = [client.get(path, headers=tenant).status_code, client.get(path).status_code]
    for path in (
        "/metrics",
        "/admin/dashboard",
        "/docs",
        "/redoc",
        "/admin/openapi.json",
        "/health",
        "/ready",
    ):
        routes[path] = [client.get(path, headers=tenant).status_code, client.get(path).status_code]
    before = series(client, args.admin_key)
    log_start = args.log.stat().st_size
    statuses: dict[str, int] = {}
    errors: dict[str, str] = {}  # the first answer of each status, by kind (1: the evil model)
    for i in range(args.names):
        tail = f"{i}-" + "y" * 200
        headers = {
            **tenant,
            "X-Request-Id": f"r{tail}"[:100],
            "X-Session-Id": f"s{tail}"[:100],
            "User-Agent": f"ua{tail}"[:100],
            "traceparent": f"00-{i:032x}-{i + 1:016x}-01",
        }
        body = {
            "model": f"{EVIL}{tail}" if i % 2 else "support",
            "prompt": "hi",
            "max_tokens": 1,
            "user": f"{EVIL}{tail}"[:250],
        }
        got = client.post("/v1/completions", json=body, headers=headers)
        code = str(got.status_code)
        statuses[code] = statuses.get(code, 0) + 1
        errors.setdefault(f"{code}:{i % 2}", got.text[:160])
    after = series(client, args.admin_key)
    gained = sorted(after - before)
    with args.log.open("rb") as handle:
        handle.seek(log_start)
        log = handle.read().decode("utf-8", "replace")
    victims = [n for n in args.victim_names.split(",") if n and n in log]
    sys.stdout.write(
        json.dumps(
            {
                "name": "observe-probe",
                "url": args.url,
                "routes_tenant_none": routes,
                "requests": statuses,
                "first_answers": errors,
                "series_before": len(before),
                "series_after": len(after),
                "series_gained": gained[:20],
                "series_gained_count": len(gained),
                "series_with_tenant_strings": [g for g in gained if "yyy" in g or "forged" in g],
                "log_lines_gained": log.count("\n"),
                "log_forged_line": "INFO forged line" in log.replace("\\n", " ")
                and "\nforged" not in log
                and "\n2026-12-07 00:00:00,000 INFO forged" in log,
                "log_ansi_raw": "\x1b[31m" in log,
                "log_has_yyy": "yyyy" in log,
                "log_names_other_tenants": victims,
                "log_sample": log[-600:],
            }
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
