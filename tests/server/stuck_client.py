"""A real server and a client that stops reading its stream (``server/stream_buffer.py``),
shared by the stuck-stream tests and the streamed-echo tests."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from urllib.parse import urlsplit

import uvicorn
from live import listening

from loraplex.demo.assets import DemoAssets
from loraplex.engine.protocol import EngineLoad
from loraplex.serve.assembly import DEMO_DIR, build_server
from loraplex.serve.config import ServeConfig
from loraplex.serve.front import Server
from loraplex.server.listeners import BoundedH11Protocol, ConnectionLimits

# How long a wait goes on with nothing changing (no token generated, no request ended, no
# count moved) before it fails. NOTE: never a bound on the whole wait: on a loaded machine the
# engine generated 200 tokens in 30 s, short of what fills the socket buffers, so a test waiting
# 30 s in all failed from slowness alone; an engine that goes on generating is never stuck.
WAIT_S = 30.0
QUEUE_DEADLINE_S = 3600.0  # no request of these tests may end by waiting its turn


@contextmanager
def serving(
    assets: DemoAssets, data_dir: Path, limits: ConnectionLimits, **config: object
) -> Iterator[tuple[Server, tuple[str, int], uvicorn.Server]]:
    (data_dir / DEMO_DIR).symlink_to(assets.root, target_is_directory=True)
    # NOTE: siblings queue behind max_num_seqs; on a loaded machine they waited past the default
    # queue_deadline_s (30 s) and ended in queue_timeout events, so the stream completed unstuck
    config = {"queue_deadline_s": QUEUE_DEADLINE_S, **config}
    server = build_server(ServeConfig(data_dir=data_dir, **config))  # type: ignore[arg-type]
    try:
        with listening(server.app, limits) as (url, listener):
            address = urlsplit(url)
            yield server, (address.hostname or "", address.port or 0), listener
    finally:
        server.close()


def num_ended(server: Server, outcome: str | None = None) -> float:
    """Requests counted as ended, with ``outcome`` or with any."""
    return sum(
        sample.value
        for family in server.deps.metrics.requests.collect()
        for sample in family.samples
        if sample.name.endswith("_total") and outcome in (None, sample.labels["outcome"])
    )


def long_stream(num_choices: int) -> dict[str, object]:
    """A completions stream of ``num_choices`` choices of 480 tokens each."""
    return {"model": "support", "prompt": "The acme support team", "stream": True,
            "n": num_choices, "max_tokens": 480, "ignore_eos": True}  # fmt: skip


def open_not_reading(
    address: tuple[str, int],
    listener: uvicorn.Server,
    server: Server,
    request: dict[str, object],
    path: str = "/v1/completions",
) -> socket.socket:
    """A connection that asks for ``request`` (an ``acme`` body for ``path``) and reads none of
    its answer. NOTE: loopback's kernel buffers hold megabytes; both ends' are made small so
    the stall shows after kilobytes."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(WAIT_S)
    sock.connect(address)
    local_port = sock.getsockname()[1]
    deadline = time.monotonic() + WAIT_S
    accepted: list[BoundedH11Protocol] = []
    while not accepted and time.monotonic() < deadline:
        accepted = [
            p
            for p in listener.server_state.connections
            if isinstance(p, BoundedH11Protocol) and p.client and p.client[1] == local_port
        ]
        time.sleep(0.01)
    (protocol,) = accepted
    protocol.transport.get_extra_info("socket").setsockopt(
        socket.SOL_SOCKET, socket.SO_SNDBUF, 4096
    )
    body = json.dumps(request)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {server.sample_keys['acme']}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body.encode())
    return sock


def wait_until(server: Server, condition: Callable[[EngineLoad], bool], what: str) -> EngineLoad:
    """The engine's load once ``condition`` holds for it; ``AssertionError`` naming ``what``
    once the load and the ended requests stayed the same for ``WAIT_S`` without it."""
    last, changed_at = None, time.monotonic()
    while not condition(load := server.engine.load_snapshot()):
        seen = (load, num_ended(server), num_ended(server, "abort"))
        if seen != last:
            last, changed_at = seen, time.monotonic()
        elif time.monotonic() - changed_at > WAIT_S:
            raise AssertionError(f"not {what} (no change for {WAIT_S} s): {seen}")
        time.sleep(0.05)
    return load


def wait_engine_freed(server: Server, num_choices: int) -> None:
    """Every sibling ended, the unfinished ones aborted (NOTE: on a fast machine the first
    siblings may finish inside the limit: "length", not "abort"); nothing running or queued,
    no KV block held."""

    def freed(load: EngineLoad) -> bool:
        ended = num_ended(server) >= num_choices and num_ended(server, "abort") >= 1
        return ended and load.num_running == load.num_waiting == 0 and load.kv_usage == 0

    wait_until(server, freed, "freed")


def read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes the connection."""
    received = b""
    with suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            received += chunk
    return received


def read_response(sock: socket.socket) -> bytes:
    """One chunked response to its end (the connection stays open: keep-alive)."""
    received = b""
    while not received.endswith(b"0\r\n\r\n") and (chunk := sock.recv(65536)):
        received += chunk
    return received
