#!/usr/bin/env python3
"""Two OTLP/HTTP "receivers" for ``trace-probe.py``, until killed:

- a sink (``tests/otlp_receiver.py``: decodes every span) behind ``--sink-port``, whose spans are
  written as JSON lines to ``--spans`` every second (name, trace id, parent, attributes);
- a black hole on ``--hole-port``: accepts each connection and never reads or answers (a
  collector that hangs).

A dead receiver needs no process: a port nothing listens on.

    PYTHONPATH=tests scripts/attacks/attack24/trace-receivers.py --sink-port 18258 \\
        --hole-port 18259 --spans /tmp/a24/spans.jsonl
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from dataclasses import asdict
from http.server import ThreadingHTTPServer
from pathlib import Path

from otlp_receiver import OtlpReceiver


def black_hole(port: int) -> None:
    server = socket.create_server(("127.0.0.1", port), backlog=512)
    held = []
    while True:
        connection, _ = server.accept()
        held.append(connection)  # never read, never closed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sink-port", type=int, required=True)
    parser.add_argument("--hole-port", type=int, required=True)
    parser.add_argument("--spans", type=Path, required=True)
    args = parser.parse_args()
    threading.Thread(target=black_hole, args=(args.hole_port,), daemon=True).start()
    receiver = OtlpReceiver()
    # NOTE: the test receiver binds an ephemeral port; re-bind it to the fixed one
    receiver._server.server_close()
    handler = receiver._server.RequestHandlerClass
    receiver._server = ThreadingHTTPServer(("127.0.0.1", args.sink_port), handler)
    receiver._thread = threading.Thread(
        target=receiver._server.serve_forever,
        daemon=True,
    )
    with receiver:
        written = 0
        while True:
            spans = receiver.snapshot()
            with args.spans.open("a") as out:
                for span in spans[written:]:
                    out.write(json.dumps(asdict(span), default=str) + "\n")
            written = len(spans)
            time.sleep(1.0)


if __name__ == "__main__":
    main()
