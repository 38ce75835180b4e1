#!/usr/bin/env python3
"""Can a tenant key (or no key) reach an admin route that changes something, by any spelling of
its path?

Against one ``loraplex serve``: every admin route of ``/admin/openapi.json`` (read with the admin
key), each method, with ``{tenant}`` / ``{name}`` filled with the OTHER tenant's adapter (globex's
``search``) and a plausible body (register, alias, rollback, visibility, revision state, release
start / promote / rollback / abort, residency pin / evict, tenant quota change, key minting),
is sent with the hostile tenant's key and with none, under spellings of its path: as listed,
``//`` for ``/``, ``/./``, ``/x/../``, a percent-encoded letter, upper case, a trailing ``/``,
``;x``, and behind ``/v1/..``. Every answer must be 401, 403, 404 or 405 (never 2xx, 3xx, 400
or 5xx: a 400 would mean the body was read), and the admin's ``/admin/audit`` and
``/admin/adapters/globex/search`` must read the same afterwards. One JSON line:

    scripts/attacks/attack25/admin-reach.py --url http://127.0.0.1:18251 --admin-key "$ADMIN" \\
        --key "$ACME"
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from collections import Counter
from urllib.parse import urlsplit

import httpx

FILL = {
    "{tenant}": "globex",
    "{name}": "search",
    "{revision}": "r1",
    "{key_id}": "1",
    "{model}": "globex/search",
}
BODIES = {
    "/admin/tenants": {"name": "evil"},
    "/admin/tenants/{tenant}": {"priority": "high", "quotas": {"max_running_seqs": 1}},
    "/admin/tenants/{tenant}/keys": {},
    "/admin/adapters": {"tenant": "globex", "name": "search", "revision": "r9", "source": "/tmp"},
    "/admin/adapters/{tenant}/{name}/alias": {"targets": [{"revision": "r1", "weight": 1}]},
    "/admin/adapters/{tenant}/{name}/rollback": {},
    "/admin/adapters/{tenant}/{name}/visibility": {"public": True},
    "/admin/revisions/{tenant}/{name}/{revision}": {"state": "deprecated"},
    "/admin/releases": {"tenant": "globex", "name": "search", "revision": "r3"},
    "/admin/residency/pin": {"model": "globex/search@r1", "tier": "L0"},
    "/admin/residency/evict": {"model": "globex/search@r1"},
    "/v1/load_lora_adapter": {"lora_name": "globex/search@r1", "lora_path": "/tmp"},
    "/v1/unload_lora_adapter": {"lora_name": "globex/search@r1"},
}
OK_STATUSES = {401, 403, 404, 405}


def spellings(path: str) -> list[str]:
    first, _, rest = path.lstrip("/").partition("/")
    letter = first[0]
    return [
        path,
        "/" + path,
        path.replace("/", "//", 2),
        f"/{first}/./{rest}",
        f"/{first}/x/../{rest}",
        f"/%{ord(letter):02x}{first[1:]}/{rest}",
        f"/{first}/%{ord(rest[0]):02X}{rest[1:]}" if rest else path + "%2F",
        path.upper(),
        path + "/",
        path + ";x",
        f"/v1/../{first}/{rest}",
        path.replace("/", "%2F"),
        path.replace("/", "%2f", 2)[0:] if rest else path,
    ]


def raw_request(url: str, method: str, path: str, headers: dict[str, str], body: bytes) -> int:
    """Sends ``path`` byte for byte (httpx normalises ``..`` and ``.``); returns the status."""
    parts = urlsplit(url)
    head = [
        f"{method} {path} HTTP/1.1",
        f"Host: {parts.netloc}",
        "Connection: close",
        f"Content-Length: {len(body)}",
        "Content-Type: application/json",
    ]
    head += [f"{k}: {v}" for k, v in headers.items()]
    data = ("\r\n".join(head) + "\r\n\r\n").encode() + body
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(data)
        reply = b""
        while b"\r\n" not in reply:
            chunk = sock.recv(4096)
            if not chunk:
                break
            reply += chunk
    line = reply.split(b"\r\n", 1)[0].decode("latin-1")
    return int(line.split()[1]) if len(line.split()) > 1 else -1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--admin-key", required=True)
    parser.add_argument("--key", required=True)
    args = parser.parse_args()
    admin = {"Authorization": f"Bearer {args.admin_key}"}
    client = httpx.Client(base_url=args.url, timeout=60)
    paths = client.get("/admin/openapi.json", headers=admin).json()["paths"]
    before = (
        client.get("/admin/audit", headers=admin).text,
        client.get("/admin/adapters/globex/search", headers=admin).text,
        client.get("/admin/tenants", headers=admin).text,
    )
    statuses: Counter[str] = Counter()
    reached = []
    sent = 0
    for template, methods in sorted(paths.items()):
        if not (template.startswith("/admin") or "lora_adapter" in template):
            continue
        path = template
        for hole, value in FILL.items():
            path = path.replace(hole, value)
        body = json.dumps(BODIES.get(template, {})).encode()
        for method in methods:
            for spelled in spellings(path):
                for who, headers in (
                    ("tenant", {"Authorization": f"Bearer {args.key}"}),
                    ("nokey", {}),
                ):
                    status = raw_request(args.url, method.upper(), spelled, headers, body)
                    sent += 1
                    statuses[str(status)] += 1
                    if status not in OK_STATUSES:
                        reached.append(f"{who} {method.upper()} {spelled} -> {status}")
    after = (
        client.get("/admin/audit", headers=admin).text,
        client.get("/admin/adapters/globex/search", headers=admin).text,
        client.get("/admin/tenants", headers=admin).text,
    )
    sys.stdout.write(
        json.dumps(
            {
                "name": "admin-reach",
                "url": args.url,
                "sent": sent,
                "statuses": dict(sorted(statuses.items())),
                "not_refused": reached[:20],
                "num_not_refused": len(reached),
                "audit_unchanged": before[0] == after[0],
                "victim_adapter_unchanged": before[1] == after[1],
                "tenants_unchanged": before[2] == after[2],
            }
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
