#!/usr/bin/env python3
"""attack21's young unread streams again, with the engine's gauges and the server's CPU sampled
through the victim's run, and honest controls that see the same arrivals.

The hog holds ``--streams`` streamed completions (``n`` ``--choices``, ``ignore_eos``,
``max_tokens`` ``--max-tokens``) round robin over ``--adapters``, each on its own connection
with a ``--receive-bytes`` receive buffer. ``--young-s S``: each is reset S seconds after it
was sent (``0``: kept until the server ends it); ``--read``: every answer is read as it comes
(without it nothing is read, only the status line peeked at); ``--gap-s G``: a thread sends its
next request no sooner than G seconds after its previous one (``0``: at once). So attack21's
young hog is ``--young-s 3``, its honest reader ``--read``, and the honest reader that sends on
the hog's clock (the same arrivals, so about the same admissions under a rate quota)
``--read --gap-s 3``. After ``--settle-s`` the victim sends completions (``--victim-model``,
``max_tokens`` 16) one after another on one connection for ``--victim-s`` seconds.

Meanwhile every ``--sample-s`` the server's ``/metrics`` (``--admin-key``) is read: the means
and maxima of the engine and connection gauges over the victim's run (``gauges``), the change of
the tenant-response, request and token counters (``counters``); and with ``--server-pid`` the
CPU seconds of the listening process and of its children (the engine) over the same time
(``cpu_s``, from ``/proc/PID/stat``). The hog's admitted streams: ``hog_first`` (the status of
each request's first bytes; ``no_head``: none before its reset) and ``hog_stream_s`` (seconds
from send to the end of each admitted stream: its reset, or the server's close). Prints one
JSON line; ``--streams 0``: no hog (the control):

    scripts/attacks/attack22/quota-young.py --url http://127.0.0.1:8000 --hog-key "$ACME_KEY" \\
        --victim-key "$GLOBEX_KEY" --admin-key "$ADMIN_KEY" --server-pid "$PID" --young-s 3
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "attack21"))
import wire  # attack21's shared helpers

GAUGES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "engine_requests{",
    "loraplex_connections{",
    "loraplex_unsent_response_bytes",
)
COUNTERS = (
    "loraplex_tenant_responses_total",
    "requests_total",
    "generated_tokens_total",
    "engine_request_pauses_total",
    "loraplex_connections_refused_total",
    "loraplex_connections_evicted_total",
)
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (``/proc/PID/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def tree_cpu(pid: int) -> dict[str, float]:
    kids = children(pid)
    return {"listener": cpu_s(pid), "children": sum(cpu_s(kid) for kid in kids)}


class Sampler:
    """Reads ``/metrics`` every ``period_s`` until stopped; means and maxima of the gauges."""

    def __init__(self, url: str, admin_key: str, pid: int | None, period_s: float) -> None:
        self.url, self.key, self.pid, self.period_s = url, admin_key, pid, period_s
        self.samples: list[dict[str, float]] = []
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.cpu: list[dict[str, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> dict[str, float]:
        return wire.metrics(self.url, self.key, GAUGES + COUNTERS)

    def start(self) -> None:
        self.first = self._read()
        if self.pid:
            self.cpu.append(tree_cpu(self.pid))
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(self.period_s):
            self.samples.append(self._read())

    def finish(self) -> dict[str, object]:
        self.stop.set()
        self.thread.join()
        if self.pid:
            self.cpu.append(tree_cpu(self.pid))
        self.last = self._read()
        names = sorted({n for s in self.samples for n in s if n.startswith(GAUGES)})
        gauges = {
            name: {
                "mean": round(statistics.fmean(s.get(name, 0.0) for s in self.samples), 3),
                "max": max(s.get(name, 0.0) for s in self.samples),
            }
            for name in names
        }
        counters = {
            name: self.last[name] - self.first.get(name, 0.0)
            for name in sorted(self.last)
            if name.startswith(COUNTERS) and self.last[name] != self.first.get(name, 0.0)
        }
        cpu = {}
        if len(self.cpu) == 2:  # before and after
            cpu = {k: round(self.cpu[1][k] - self.cpu[0][k], 2) for k in self.cpu[0]}
        return {"samples": len(self.samples), "gauges": gauges, "counters": counters, "cpu_s": cpu}


def main() -> int:  # noqa: PLR0915 (one attack, read top to bottom)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--hog-key", required=True)
    parser.add_argument("--victim-key", required=True)
    parser.add_argument("--admin-key", required=True)
    parser.add_argument("--server-pid", type=int)
    parser.add_argument("--streams", type=int, default=48)
    parser.add_argument("--young-s", type=float, default=3.0)
    parser.add_argument("--read", action="store_true", help="read every answer (honest)")
    parser.add_argument("--gap-s", type=float, default=0.0)
    parser.add_argument("--adapters", default="support,billing,legal,triage")
    parser.add_argument("--choices", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--receive-bytes", type=int, default=4096)
    parser.add_argument("--settle-s", type=float, default=5.0)
    parser.add_argument("--victim-s", type=float, default=30.0)
    parser.add_argument("--sample-s", type=float, default=0.5)
    parser.add_argument("--victim-model", default="codegen")
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    parts = urlsplit(args.url)
    target = (parts.hostname or "127.0.0.1", parts.port or 80)
    adapters = args.adapters.split(",")
    stop, opened, first = threading.Event(), [0], collections.Counter[str]()
    stream_s: list[float] = []
    lock = threading.Lock()

    def one(sock: socket.socket, request: bytes) -> None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, args.receive_bytes)
        sock.settimeout(1.0)
        sock.connect(target)
        sock.sendall(request)
        began = time.monotonic()
        with lock:
            opened[0] += 1

        def young() -> bool:
            return bool(args.young_s) and time.monotonic() - began >= args.young_s

        head = b""
        while not head and not stop.is_set() and not young():
            try:
                sock.settimeout(0.2)
                head = sock.recv(16, socket.MSG_PEEK) or b"closed"
            except TimeoutError:
                pass
        status = head.split(b" ")[1].decode() if head.count(b" ") else "no_head"
        with lock:
            first[status] += 1
        ended, tail = False, b""
        while not stop.is_set() and not young() and not ended:
            try:
                if args.read:  # to the close, or to the end of the chunked stream
                    sock.settimeout(0.2)
                    chunk = sock.recv(65536)
                    tail = (tail + chunk)[-8:]
                    ended = not chunk or tail.endswith(b"\r\n0\r\n\r\n")
                else:
                    time.sleep(0.05)
                    sock.settimeout(0.001)
                    ended = sock.recv(1, socket.MSG_PEEK) == b""
            except (TimeoutError, BlockingIOError):
                pass
        if status == "200":
            with lock:
                stream_s.append(time.monotonic() - began)

    def hog(index: int) -> None:
        request = wire.completion(
            args.hog_key,
            adapters[index % len(adapters)],
            max_tokens=args.max_tokens,
            stream=True,
            choices=args.choices,
        )
        while not stop.is_set():
            sent = time.monotonic()
            sock = socket.socket()
            try:
                one(sock, request)
            except OSError:
                with lock:
                    first["error"] += 1
                time.sleep(0.2)
            finally:
                wire.reset(sock)
            stop.wait(max(0.0, sent + args.gap_s - time.monotonic()))

    load_before = os.getloadavg()
    for index in range(args.streams):
        threading.Thread(target=hog, args=(index,), daemon=True).start()
    if args.streams:
        time.sleep(args.settle_s)
    sampler = Sampler(args.url, args.admin_key, args.server_pid, args.sample_s)
    sampler.start()
    with lock:
        before = (opened[0], first.copy(), len(stream_s))
    samples, statuses = wire.victim(target, args.victim_key, args.victim_model, args.victim_s)
    with lock:
        during = (opened[0] - before[0], first - before[1], stream_s[before[2] :])
    seen = sampler.finish()
    stop.set()
    line = {
        "name": "quota-young",
        "label": args.label,
        "url": args.url,
        "streams": args.streams,
        "young_s": args.young_s,
        "read": args.read,
        "gap_s": args.gap_s,
        "choices": args.choices,
        **wire.summary(samples),
        "victim_statuses": dict(statuses),
        "hog_opened": during[0],
        "hog_first": dict(during[1]),
        "hog_streams": len(during[2]),
        "hog_stream_s": round(sum(during[2]), 2),
        **seen,
        "load": [load_before[0], os.getloadavg()[0]],
    }
    sys.stdout.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
