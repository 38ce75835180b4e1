#!/usr/bin/env python3
"""A tenant's trace headers, and a trace receiver that is dead or hangs.

``--headers`` (against a server exporting to ``trace-receivers.py``'s sink at ratio 1): the
hostile tenant sends completions with a ``traceparent`` of 8 KiB, 50 ``traceparent`` headers, an
upper-case one, version ``ff``, a ``tracestate`` and a ``baggage`` of 4 KiB each carrying a
marker, control characters, and one reusing the victim's trace id (the victim sent it first).
Counts the statuses, then reads the sink's spans (``--spans``): which traces the hostile
tenant's requests joined, whether any span carries the marker, how many root spans the victim's
trace holds and from how many tenants.

``--timing`` (under the bench lock): rounds over the servers named in ``--servers``
(``label=url=key``, e.g. tracing off, to a working sink, to a black hole, to a dead port; every
request traced), in A B C D D C B A order, each taking ``--per-round`` sequential greedy
completions (``max_tokens`` 16) of the victim's adapter; medians and each server's ratio to the
first. One JSON line each:

    scripts/attacks/attack24/trace-probe.py --headers --url http://127.0.0.1:18252 \\
        --hostile-key "$ACME" --victim-key "$GLOBEX" --spans /tmp/a24/spans.jsonl
    scripts/attacks/attack24/trace-probe.py --timing --servers off=http://...=KEY ...
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

MARKER = "zq8marker"
VICTIM_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def complete(client: httpx.Client, key: str, model: str, headers: list[tuple[str, str]]) -> int:
    body = {"model": model, "prompt": "The globex search", "max_tokens": 4, "temperature": 0}
    hdrs = [("Authorization", f"Bearer {key}"), *headers]
    return client.post("/v1/completions", json=body, headers=hdrs).status_code


def header_cases() -> dict[str, list[tuple[str, str]]]:
    ok = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    return {
        "traceparent-8KiB": [("traceparent", ok + "0" * 8192)],
        "traceparent-x50": [("traceparent", ok)] * 50,
        "traceparent-upper": [("traceparent", ok.upper())],
        "traceparent-version-ff": [("traceparent", "ff" + ok[2:])],
        "traceparent-zero-ids": [("traceparent", "00-" + "0" * 32 + "-" + "0" * 16 + "-01")],
        "tracestate-4KiB": [("traceparent", ok), ("tracestate", f"{MARKER}=" + "a" * 4096)],
        "baggage-4KiB": [("traceparent", ok), ("baggage", f"userId={MARKER}," + "k=v," * 1000)],
        "baggage-x50": [("baggage", f"{MARKER}{i}=1") for i in range(50)],
        "tracestate-control": [("tracestate", f"{MARKER}=a\tb")],
        "victims-trace-id": [("traceparent", f"00-{VICTIM_TRACE}-00f067aa0ba902b7-01")],
    }


def headers_probe(args: argparse.Namespace) -> dict[str, object]:
    statuses: dict[str, int] = {}
    with httpx.Client(base_url=args.url, timeout=60) as client:
        own = [("traceparent", f"00-{VICTIM_TRACE}-a1a2a3a4a5a6a7a8-01")]
        statuses["victim-first"] = complete(client, args.victim_key, "search", own)
        for name, headers in header_cases().items():
            try:
                statuses[name] = complete(client, args.hostile_key, "support", headers)
            except httpx.HTTPError as exc:
                statuses[name] = -1
                statuses[f"{name} error"] = type(exc).__name__  # type: ignore[assignment]
    time.sleep(8)  # the batch processor exports every 5 s
    spans = [json.loads(line) for line in args.spans.read_text().splitlines()]
    victim_roots = [s for s in spans if s["trace_id"] == VICTIM_TRACE and s["kind"] == 2]
    tenants = Counter(s["attributes"].get("loraplex.tenant") for s in victim_roots)
    with_marker = [s["name"] for s in spans if MARKER in json.dumps(s)]
    return {
        "name": "trace-headers",
        "url": args.url,
        "statuses": statuses,
        "spans_read": len(spans),
        "victim_trace_roots": len(victim_roots),
        "victim_trace_tenants": len(tenants),
        "spans_with_marker": len(with_marker),
        "attribute_keys": sorted({k for s in spans for k in s["attributes"]}),
    }


def flood(
    servers: dict[str, tuple[str, str]], current: list[str], stop: threading.Event, out: Counter
) -> None:
    """The hostile tenant's flagged requests (a fresh sampled traceparent each, 1 token) to
    whichever server is being measured."""
    clients = {
        label: httpx.Client(base_url=url, timeout=120) for label, (url, _) in servers.items()
    }
    body = {"model": "support", "prompt": "x", "max_tokens": 1}
    rng = random.Random(threading.get_ident())
    while not stop.is_set():
        label = current[0]
        parent = f"00-{rng.getrandbits(128):032x}-{rng.getrandbits(64) | 1:016x}-01"
        headers = {"Authorization": f"Bearer {servers[label][1]}", "traceparent": parent}
        try:
            got = clients[label].post("/v1/completions", json=body, headers=headers)
            out[f"{label} {got.status_code}"] += 1
        except httpx.HTTPError as exc:
            out[f"{label} {type(exc).__name__}"] += 1


def timing(args: argparse.Namespace) -> dict[str, object]:
    servers = [entry.split("=") for entry in args.servers]  # label=url=victim key[=hostile key]
    samples: dict[str, list[float]] = {entry[0]: [] for entry in servers}
    clients = {entry[0]: httpx.Client(base_url=entry[1], timeout=120) for entry in servers}
    keys = {entry[0]: entry[2] for entry in servers}
    body = {"model": "search", "prompt": "The globex search", "max_tokens": 16, "temperature": 0}
    labels = [entry[0] for entry in servers]
    current = [labels[0]]
    stop = threading.Event()
    flooded: Counter = Counter()
    hostile = {entry[0]: (entry[1], entry[3]) for entry in servers if len(entry) > 3}
    flooders = [
        threading.Thread(target=flood, args=(hostile, current, stop, flooded), daemon=True)
        for _ in range(args.flood if hostile else 0)
    ]
    for thread in flooders:
        thread.start()
    failed = 0
    for i in range(args.rounds):
        for label in labels + labels[::-1] if i % 2 == 0 else labels[::-1] + labels:
            current[0] = label
            time.sleep(0.5 if flooders else 0)  # the flood moves over first
            for _ in range(args.per_round):
                start = time.perf_counter()
                got = clients[label].post(
                    "/v1/completions", json=body, headers={"Authorization": f"Bearer {keys[label]}"}
                )
                samples[label].append((time.perf_counter() - start) * 1e3)
                failed += got.status_code != 200
    stop.set()
    first = labels[0]
    med = {label: statistics.median(values) for label, values in samples.items()}
    return {
        "name": "trace-timing",
        "rounds": args.rounds,
        "flood_threads": len(flooders),
        "flood_answers": dict(sorted(flooded.items())),
        "requests_each": len(samples[first]),
        "failed": failed,
        "median_ms": {label: round(value, 2) for label, value in med.items()},
        f"ratio_to_{first}": {label: round(value / med[first], 3) for label, value in med.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--headers", action="store_true")
    parser.add_argument("--timing", action="store_true")
    parser.add_argument("--url")
    parser.add_argument("--hostile-key")
    parser.add_argument("--victim-key")
    parser.add_argument("--spans", type=Path)
    parser.add_argument("--servers", nargs="*", default=[])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=8)
    parser.add_argument("--flood", type=int, default=0, help="hostile threads (label=url=v=h)")
    args = parser.parse_args()
    if args.headers:
        sys.stdout.write(json.dumps(headers_probe(args)) + "\n")
    if args.timing:
        sys.stdout.write(json.dumps(timing(args)) + "\n")


if __name__ == "__main__":
    main()
