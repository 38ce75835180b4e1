#!/usr/bin/env python3
"""One tenant resets its connections at volume right after a request head (``--at head``: the
body never sent), right after a whole request (``request``), or right after its stream's first
token (``token``; ``read``: each stream read to its end, the honest control: with
``--max-tokens 1`` about the engine work of ``token``); another tenant's completions meanwhile;
then what the server still holds.

``--threads`` hog threads each loop: connect, send, reset (SO_LINGER 0), for ``--hog-s`` seconds,
round robin over ``--adapters`` (streamed ``n`` ``--choices``, ``max_tokens`` ``--max-tokens``).
The victim sends completions (``--victim-model``, ``max_tokens`` 16) one after another for the
same time. ``--settle-after-s`` after the hog stops, the server's gauges (``/metrics``: open
connections, engine requests, KV use, unsent bytes; ``/admin/residency``: entries with a
refcount, i.e. leased adapters) and the listening process's open fds (``--server-pid``) are read;
with ``--admin-key`` each is read before the run too. Prints one JSON line; ``--threads 0``: no
hog (the control):

    scripts/attacks/attack21/reset-flood.py --url http://127.0.0.1:8000 --hog-key "$ACME_KEY" \\
        --victim-key "$GLOBEX_KEY" --admin-key "$ADMIN_KEY" --threads 8 --at token
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import sys
import threading
import time
import urllib.request
from urllib.parse import urlsplit

import wire

GAUGES = (
    "loraplex_connections{",
    "engine_requests{",
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
    "loraplex_unsent_response_bytes",
)


def leased(url: str, admin_key: str | None) -> int | None:
    if not admin_key:
        return None
    request = urllib.request.Request(
        f"{url}/admin/residency", headers={"Authorization": f"Bearer {admin_key}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        entries = json.loads(answer.read())["entries"]
    return sum(1 for entry in entries if entry.get("refcount"))


def fds(pid: int | None) -> int | None:
    return len(os.listdir(f"/proc/{pid}/fd")) if pid else None


def state(url: str, admin_key: str | None, pid: int | None) -> dict[str, object]:
    return {
        "gauges": wire.metrics(url, admin_key, GAUGES),
        "leased_entries": leased(url, admin_key),
        "server_fds": fds(pid),
    }


def main() -> int:  # noqa: PLR0915 (one attack, read top to bottom)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--hog-key", required=True)
    parser.add_argument("--victim-key", required=True)
    parser.add_argument("--admin-key")
    parser.add_argument("--server-pid", type=int)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--at", choices=("head", "request", "token", "read"), default="token")
    parser.add_argument("--adapters", default="support,billing,legal,triage")
    parser.add_argument("--choices", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--hog-s", type=float, default=30.0)
    parser.add_argument("--settle-after-s", type=float, default=5.0)
    parser.add_argument("--victim-model", default="codegen")
    args = parser.parse_args()
    parts = urlsplit(args.url)
    target = (parts.hostname or "127.0.0.1", parts.port or 80)
    adapters = args.adapters.split(",")
    before = state(args.url, args.admin_key, args.server_pid)
    stop, outcomes = threading.Event(), collections.Counter[str]()

    def hog(index: int) -> None:
        model = adapters[index % len(adapters)]
        request = wire.completion(
            args.hog_key,
            model,
            max_tokens=args.max_tokens,
            stream=args.at in ("token", "read"),
            choices=args.choices,
        )
        head, _, _ = request.partition(b"\r\n\r\n")
        while not stop.is_set():
            sock = socket.socket()
            try:
                sock.settimeout(5.0)
                sock.connect(target)
                if args.at == "head":
                    sock.sendall(head + b"\r\n\r\n")
                else:
                    sock.sendall(request)
                if args.at == "token":
                    data = b""
                    while b"data: " not in data:
                        chunk = sock.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                    outcomes["token" if b"data: " in data else "no_token"] += 1
                elif args.at == "read":  # the honest control: the whole stream read
                    data = b""
                    while b"data: [DONE]" not in data[-64:]:
                        chunk = sock.recv(65536)
                        if not chunk:
                            break
                        data = data[-64:] + chunk
                    outcomes["read"] += 1
                else:
                    outcomes["reset"] += 1
            except OSError:
                outcomes["error"] += 1
                time.sleep(0.05)
            finally:
                wire.reset(sock)

    threads = [threading.Thread(target=hog, args=(i,), daemon=True) for i in range(args.threads)]
    for thread in threads:
        thread.start()
    samples, statuses = wire.victim(target, args.victim_key, args.victim_model, args.hog_s)
    stop.set()
    for thread in threads:
        thread.join(10)
    time.sleep(args.settle_after_s)
    after = state(args.url, args.admin_key, args.server_pid)
    line = {
        "name": "reset-flood",
        "url": args.url,
        "threads": args.threads,
        "at": args.at,
        **wire.summary(samples),
        "victim_statuses": dict(statuses),
        "hog_outcomes": dict(outcomes),
        "before": before,
        "after": after,
    }
    sys.stdout.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
