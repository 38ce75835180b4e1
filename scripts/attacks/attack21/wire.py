"""What the attack21 scripts share: raw HTTP/1.1 requests, the victim's loop, percentiles. Stdlib
only; the scripts import it from their own folder."""

from __future__ import annotations

import collections
import json
import socket
import statistics
import struct
import time
import urllib.request


def completion(
    key: str, model: str, *, max_tokens: int = 16, stream: bool = False, choices: int = 1
) -> bytes:
    body = json.dumps(
        {
            "model": model,
            "prompt": "hi",
            "max_tokens": max_tokens,
            "n": choices,
            "ignore_eos": True,
            "stream": stream,
        }
    )
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    ).encode()


def reset(sock: socket.socket) -> None:
    """Closes ``sock`` with a TCP reset (SO_LINGER 0)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()


def read_answer(sock: socket.socket, statuses: collections.Counter[str]) -> bool:
    """Reads one answer framed by Content-Length; False at a close before it."""
    data = b""
    while True:
        head, found, rest = data.partition(b"\r\n\r\n")
        if found:
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            if len(rest) >= length:
                statuses[head.split()[1].decode()] += 1
                return True
        chunk = sock.recv(65536)
        if not chunk:
            statuses["closed"] += 1
            return False
        data += chunk


def victim(
    target: tuple[str, int], key: str, model: str, seconds: float, timeout_s: float = 30.0
) -> tuple[list[tuple[float, float, str]], collections.Counter[str]]:
    """Completions one after another for ``seconds``: (start offset, seconds, status) each."""
    samples: list[tuple[float, float, str]] = []
    statuses = collections.Counter[str]()
    began = time.monotonic()
    sock: socket.socket | None = None
    while time.monotonic() - began < seconds:
        start = time.monotonic()
        before = statuses.copy()
        try:
            if sock is None:
                sock = socket.create_connection(target, timeout=timeout_s)
            sock.sendall(completion(key, model))
            if not read_answer(sock, statuses):
                sock.close()
                sock = None
        except OSError:
            statuses["error"] += 1
            if sock is not None:
                sock.close()
            sock = None
        status = next(iter(statuses - before), "error")
        samples.append((start - began, time.monotonic() - start, status))
    if sock is not None:
        sock.close()
    return samples, statuses


def summary(samples: list[tuple[float, float, str]]) -> dict[str, object]:
    """Served fraction, median and P99 seconds of the 200s (P99: the 99th percentile by rank)."""
    ok = sorted(seconds for _, seconds, status in samples if status == "200")
    return {
        "victim_requests": len(samples),
        "victim_served": round(len(ok) / len(samples), 4) if samples else None,
        "victim_median_s": round(statistics.median(ok), 4) if ok else None,
        "victim_p99_s": round(ok[min(len(ok) - 1, int(0.99 * len(ok)))], 4) if ok else None,
    }


def metrics(url: str, admin_key: str | None, prefixes: tuple[str, ...]) -> dict[str, float]:
    """The /metrics samples whose names start with one of ``prefixes`` (empty without a key)."""
    if not admin_key:
        return {}
    request = urllib.request.Request(
        f"{url}/metrics", headers={"Authorization": f"Bearer {admin_key}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        text = answer.read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith(prefixes):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found
