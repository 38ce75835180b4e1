#!/usr/bin/env python3
"""One tenant sends requests that are refused, at the rate its threads can, while another tenant
sends completions: what does a refusal cost the other tenant, beside an honest request of the
same rate?

``--threads`` hog threads each loop: send one request (``--kind``), read its answer, and send
the next on the same connection while the server keeps it open (a new connection otherwise), for
``--victim-s`` seconds (after ``--settle-s``). Kinds:

- ``models``: ``GET /v1/models`` (the honest control: answered 200, nothing generated);
- ``quota``: a streamed completion (``n`` 4, ``max_tokens`` 400) that the tenant's
  ``max_requests_per_s`` refuses (429) when it is set; the rare one admitted is reset at once;
- ``depth``: a JSON body nested ``--size`` arrays deep;
- ``big-n``: a completion with ``n`` 1,000,000;
- ``logit-bias``: ``logit_bias`` with ``--size`` keys (as many as fit ``max_body_bytes``);
- ``stop``: ``stop`` a list of ``--size`` strings;
- ``model-unicode``: ``model`` a string of ``--size`` characters mixing a lone surrogate escape,
  NUL, right-to-left marks and combining characters;
- ``flat-floats``, ``flat-ints``, ``flat-strings``: ``prompt`` one flat array of ``1.0``, ``1``
  or ``""`` making the body about ``--size`` bytes (no object inside: nothing for a parser hook);
- ``max-body``: a completion whose ``prompt`` makes the body exactly ``max_body_bytes``
  (``--size`` bytes) of valid JSON, its ``max_tokens`` 0 (refused: at least 1).

The victim sends completions (``--victim-model``, ``max_tokens`` 16) one after another on one
connection. Prints one JSON line: the victim's median and P99, the hog's answers by status (and
the first error message seen of each), its answers per second, and the listening process's CPU
seconds over the run (``--server-pid``). ``--threads 0``: no hog (the control):

    scripts/attacks/attack22/body-flood.py --url http://127.0.0.1:8000 --hog-key "$ACME_KEY" \\
        --victim-key "$GLOBEX_KEY" --server-pid "$PID" --kind depth --threads 8
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
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "attack21"))
import wire  # attack21's shared helpers

TICKS = os.sysconf("SC_CLK_TCK")
FLAT = {"flat-floats": 1.0, "flat-ints": 1, "flat-strings": ""}


def cpu_s(pid: int | None) -> float | None:
    if not pid:
        return None
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def body(kind: str, size: int) -> dict[str, object] | str:
    base: dict[str, object] = {"model": "support", "prompt": "hi", "max_tokens": 4}
    if kind == "depth":
        return "[" * size + "]" * size
    if kind == "big-n":
        return {**base, "n": 1_000_000}
    if kind == "logit-bias":
        return {**base, "logit_bias": {str(i): 1.0 for i in range(size)}}
    if kind == "stop":
        return {**base, "stop": [f"s{i}" for i in range(size)]}
    if kind == "model-unicode":
        return {**base, "model": ("\ud800\u0000\u202e\u0301" * size)[:size]}
    if kind in FLAT:  # one flat array as the prompt: numbers or strings, ``size`` bytes in all
        item = FLAT[kind]
        return {**base, "prompt": [item] * max(1, (size - 60) // (len(json.dumps(item)) + 2))}
    if kind == "max-body":
        return {**base, "max_tokens": 0, "prompt": "x" * max(0, size - 60)}
    raise ValueError(kind)


def request(key: str, kind: str, size: int) -> bytes:
    if kind == "models":
        return f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n".encode()
    if kind == "quota":
        return wire.completion(key, "support", max_tokens=400, stream=True, choices=4)
    shaped = body(kind, size)
    text = shaped if isinstance(shaped, str) else json.dumps(shaped)
    data = text.encode("utf-8", "surrogatepass")
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


def answer(sock: socket.socket) -> tuple[str, bytes, bool]:
    """(status, body head, closed) of one answer: a stream (an admitted ``quota`` request) is
    not read past its head, and its connection is reset."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return "closed", b"", True
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status = head.split()[1].decode()
    lower = head.lower()
    if b"content-length:" not in lower:
        return status, b"", True  # streamed: not read
    length = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return status, rest, True
        rest += chunk
    return status, rest[:300], b"connection: close" in lower


def main() -> int:  # noqa: PLR0915 (one attack, read top to bottom)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--hog-key", required=True)
    parser.add_argument("--victim-key", required=True)
    parser.add_argument("--server-pid", type=int)
    parser.add_argument("--kind", default="models")
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--settle-s", type=float, default=2.0)
    parser.add_argument("--victim-s", type=float, default=20.0)
    parser.add_argument("--victim-model", default="codegen")
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    parts = urlsplit(args.url)
    target = (parts.hostname or "127.0.0.1", parts.port or 80)
    payload = request(args.hog_key, args.kind, args.size)
    stop, lock = threading.Event(), threading.Lock()
    statuses, messages = collections.Counter[str](), dict[str, str]()
    connections = [0]

    def hog() -> None:
        sock: socket.socket | None = None
        while not stop.is_set():
            try:
                if sock is None:
                    sock = socket.create_connection(target, timeout=10)
                    with lock:
                        connections[0] += 1
                sock.sendall(payload)
                status, head, closed = answer(sock)
            except OSError:
                status, head, closed = "error", b"", True
            with lock:
                statuses[status] += 1
                messages.setdefault(status, head.decode(errors="replace")[:200])
            if closed and sock is not None:
                wire.reset(sock)
                sock = None
        if sock is not None:
            wire.reset(sock)

    threads = [threading.Thread(target=hog, daemon=True) for _ in range(args.threads)]
    for thread in threads:
        thread.start()
    if args.threads:
        time.sleep(args.settle_s)
    load_before = os.getloadavg()[0]
    with lock:
        before = statuses.copy()
    cpu_before, began = cpu_s(args.server_pid), time.monotonic()
    samples, victim = wire.victim(target, args.victim_key, args.victim_model, args.victim_s)
    cpu_after, elapsed = cpu_s(args.server_pid), time.monotonic() - began
    with lock:
        during = statuses - before
    stop.set()
    line = {
        "name": "body-flood",
        "label": args.label,
        "kind": args.kind,
        "size": args.size,
        "threads": args.threads,
        "request_bytes": len(payload),
        **wire.summary(samples),
        "victim_statuses": dict(victim),
        "hog_statuses": dict(during),
        "hog_per_s": round(sum(during.values()) / elapsed, 1),
        "hog_connections": connections[0],
        "hog_messages": messages,
        "listener_cpu_s": None
        if cpu_before is None or cpu_after is None
        else round(cpu_after - cpu_before, 2),
        "load": [load_before, os.getloadavg()[0]],
    }
    sys.stdout.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
