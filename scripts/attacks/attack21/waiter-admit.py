#!/usr/bin/env python3
"""Newcomers that close at the moment they are let in (``connections.py``: the waiting places),
while one tenant holds every connection; another tenant's new connections.

attack20's ``waiter-squat`` (loaded from ``../attack20/waiter-squat``) with one more squatter:
each connection sends, while it waits, a request head (the hog's key) with a 4 MiB body
announced, and as much of the body as the kernels take (a 4 KiB send buffer). A waiting
newcomer is not read, so the sends stall; the first send that goes through after a stall of
``--stall-s`` means the server began to read it, i.e. let it in, and the squatter resets it at
that moment (``--at-admit reset``, or closes it: ``fin``), then opens another. ``--at-admit
none``: no squatter (the control). Start the server with ``--max-connections`` equal to
``--hold``. Prints one JSON line: the victim's outcomes, median and P99 seconds, the squatter's
connections opened and how many it saw let in, and the server's connection gauges afterwards
(``--admin-key``):

    scripts/attacks/attack21/waiter-admit.py --url http://127.0.0.1:8000 \\
        --hog-key "$ACME_KEY" --victim-key "$GLOBEX_KEY" --hold 64 --at-admit reset
"""

from __future__ import annotations

import argparse
import collections
import json
import socket
import statistics
import sys
import threading
import time
import types
from importlib.machinery import SourceFileLoader
from pathlib import Path
from urllib.parse import urlsplit

import wire

_SQUAT = Path(__file__).resolve().parent.parent / "attack20" / "waiter-squat"
squat = types.ModuleType("waiter_squat")
squat.__file__ = str(_SQUAT)
SourceFileLoader("waiter_squat", str(_SQUAT)).exec_module(squat)
BODY = 4 << 20


class AdmitSquatter:
    """Waits in a place, closes when let in (module docstring)."""

    def __init__(self, target: tuple[str, int], address: str, key: str, mode: str,
                 stall_s: float) -> None:  # fmt: skip
        self.target, self.address, self.mode, self.stall_s = target, address, mode, stall_s
        self.head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}"
                     f"\r\nContent-Type: application/json\r\nContent-Length: {BODY}\r\n\r\n"
                     ).encode()  # fmt: skip
        self.stop = threading.Event()
        self.opened = self.let_in = 0

    def run(self) -> None:
        chunk = b" " * 1024
        while not self.stop.is_set():
            sock = socket.socket()
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
                sock.bind((self.address, 0))
                sock.connect(self.target)
                self.opened += 1
                sock.sendall(self.head)
                sock.settimeout(0.02)
                stalled_since, sent = None, 0
                while not self.stop.is_set() and sent < BODY:
                    try:
                        sent += sock.send(chunk)
                    except TimeoutError:
                        stalled_since = stalled_since or time.monotonic()
                        continue
                    if stalled_since and time.monotonic() - stalled_since >= self.stall_s:
                        self.let_in += 1
                        break
                    stalled_since = None
            except OSError:
                time.sleep(0.05)
            finally:
                if self.mode == "reset":
                    wire.reset(sock)
                else:
                    sock.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--hog-key", required=True)
    parser.add_argument("--victim-key", required=True)
    parser.add_argument("--admin-key")
    parser.add_argument("--hold", type=int, default=64)
    parser.add_argument("--hog-address", default="127.0.0.2,127.0.0.3")
    parser.add_argument("--at-admit", choices=("none", "reset", "fin"), default="reset")
    parser.add_argument("--squat-address", default="127.0.0.4")
    parser.add_argument("--squatters", type=int, default=8)
    parser.add_argument("--stall-s", type=float, default=0.3)
    parser.add_argument("--victim-requests", type=int, default=40)
    parser.add_argument("--pause-s", type=float, default=0.5)
    parser.add_argument("--settle-s", type=float, default=5.0)
    args = parser.parse_args()
    parts = urlsplit(args.url)
    target = (parts.hostname or "127.0.0.1", parts.port or 80)
    hog = squat.body_hog.Hog(target, args.hog_key, args.hog_address.split(","), mode="flight")
    squatter = AdmitSquatter(target, args.squat_address, args.hog_key, args.at_admit,
                             args.stall_s)  # fmt: skip
    threads = [threading.Thread(target=hog.hold, args=(i,), daemon=True) for i in range(args.hold)]
    if args.at_admit != "none":
        threads += [threading.Thread(target=squatter.run, daemon=True)
                    for _ in range(args.squatters)]  # fmt: skip
    for thread in threads:
        thread.start()
    time.sleep(args.settle_s)
    results = []
    for _ in range(args.victim_requests):
        results.append(squat.body_hog.victim(target, args.victim_key))
        time.sleep(args.pause_s)
    hog.stop.set()
    squatter.stop.set()
    time.sleep(3.0)
    seconds = sorted(s for _, s in results)
    line = {
        "name": "waiter-admit", "at_admit": args.at_admit, "url": args.url, "hold": args.hold,
        "victim_requests": len(results),
        "victim_outcomes": dict(collections.Counter(status for status, _ in results)),
        "victim_median_s": round(statistics.median(seconds), 4),
        "victim_p99_s": round(seconds[min(len(seconds) - 1, int(0.99 * len(seconds)))], 4),
        "hog_opened": hog.opened, "squat_opened": squatter.opened, "squat_let_in": squatter.let_in,
        "after": wire.metrics(args.url, args.admin_key, ("loraplex_connections",)),
    }  # fmt: skip
    sys.stdout.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
