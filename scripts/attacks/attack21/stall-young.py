#!/usr/bin/env python3
"""One tenant keeps its unread SSE streams young: each is closed (a reset) ``--young-s`` after it
was opened, before it could be paused, and opened again at once; another tenant's completions
meanwhile.

The hog holds ``--streams`` streamed completions (``n`` ``--choices``, ``ignore_eos``,
``max_tokens`` ``--max-tokens``) round robin over ``--adapters``, each on its own connection with
a ``--receive-bytes`` receive buffer, reading nothing (``--read``: reading everything, an honest
client, the control for the hog's load itself); ``--young-s 0`` keeps each open until the
server ends it (attack20's ``stall-streams``), then opens another. After ``--settle-s`` the victim
sends completions (``--victim-model``, ``max_tokens`` 16) one after another on one connection
for ``--victim-s`` seconds. Prints one JSON line: the victim's served fraction, median and P99
over the whole run and per ``--window-s`` window (does the harm last?), the hog's streams opened
and the statuses of the first bytes it saw. ``--streams 0``: no hog (the control):

    scripts/attacks/attack21/stall-young.py --url http://127.0.0.1:8000 \\
        --hog-key "$ACME_KEY" --victim-key "$GLOBEX_KEY" --streams 48 --young-s 2
"""

from __future__ import annotations

import argparse
import collections
import json
import socket
import sys
import threading
import time
from urllib.parse import urlsplit

import wire


def main() -> int:  # noqa: PLR0915 (one attack, read top to bottom)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--hog-key", required=True)
    parser.add_argument("--victim-key", required=True)
    parser.add_argument("--streams", type=int, default=48)
    parser.add_argument("--young-s", type=float, default=2.0)
    parser.add_argument("--read", action="store_true", help="read every stream (honest)")
    parser.add_argument("--adapters", default="support,billing,legal,triage")
    parser.add_argument("--choices", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--receive-bytes", type=int, default=4096)
    parser.add_argument("--settle-s", type=float, default=5.0)
    parser.add_argument("--victim-s", type=float, default=40.0)
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--victim-model", default="codegen")
    args = parser.parse_args()
    parts = urlsplit(args.url)
    target = (parts.hostname or "127.0.0.1", parts.port or 80)
    adapters = args.adapters.split(",")
    stop, opened, first = threading.Event(), [0], collections.Counter[str]()

    def hog(index: int) -> None:
        request = wire.completion(
            args.hog_key,
            adapters[index % len(adapters)],
            max_tokens=args.max_tokens,
            stream=True,
            choices=args.choices,
        )
        while not stop.is_set():
            sock = socket.socket()
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, args.receive_bytes)
                sock.settimeout(1.0)
                sock.connect(target)
                opened[0] += 1
                sock.sendall(request)
                began = time.monotonic()
                # peek at the status line (it comes with the first event: a stream waiting for
                # seats sends nothing yet), leaving the stream otherwise unread
                head = b""
                while not head and not stop.is_set():
                    if args.young_s and time.monotonic() - began >= args.young_s:
                        break
                    try:
                        sock.settimeout(0.2)
                        head = sock.recv(16, socket.MSG_PEEK) or b"closed"
                    except TimeoutError:
                        pass
                first[head.split(b" ")[1].decode() if head.count(b" ") else "no_head"] += 1
                while not stop.is_set() and args.read:
                    sock.settimeout(1.0)
                    try:
                        if not sock.recv(65536):
                            break  # ended: open another
                    except TimeoutError:
                        pass
                while not stop.is_set() and not args.read:
                    if args.young_s and time.monotonic() - began >= args.young_s:
                        break
                    time.sleep(0.05 if args.young_s else 1.0)
                    if not args.young_s:
                        try:
                            sock.settimeout(0.001)
                            if sock.recv(1, socket.MSG_PEEK) == b"":
                                break
                        except (TimeoutError, BlockingIOError):
                            pass
            except OSError:
                first["error"] += 1
                time.sleep(0.2)
            finally:
                wire.reset(sock)

    for index in range(args.streams):
        threading.Thread(target=hog, args=(index,), daemon=True).start()
    if args.streams:
        time.sleep(args.settle_s)
    samples, statuses = wire.victim(target, args.victim_key, args.victim_model, args.victim_s)
    stop.set()
    windows = []
    edge = 0.0
    while edge < args.victim_s:
        part = [s for s in samples if edge <= s[0] < edge + args.window_s]
        windows.append({"from_s": edge, **wire.summary(part)})
        edge += args.window_s
    line = {
        "name": "stall-young",
        "url": args.url,
        "streams": args.streams,
        "young_s": args.young_s,
        "read": args.read,
        "choices": args.choices,
        **wire.summary(samples),
        "victim_statuses": dict(statuses),
        "windows": windows,
        "hog_opened": opened[0],
        "hog_first": dict(first),
    }
    sys.stdout.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
