"""The socket-level attacker kinds of ``bench serve``: connections that never finish a request,
and streams whose client never reads.

- ``half-open-flood``: ``flood_sockets`` connections without credentials, each sending the start
  of a request head (no blank line ending it) and holding; one the server closes is reopened.
  Against a loopback server they come from ``FLOOD_SOURCE_HOST``, not the victims' address.
  Issue 25: about 1,100 such sockets made 95 % of all tenants' requests fail.
- ``stuck-stream``: ``STUCK_STREAMS`` authenticated streaming requests for long, wide outputs
  (``n`` 16, 20 top logprobs per token: about 8 MB each) on sockets whose receive buffer is
  small and which are never read, so the kernel cannot absorb the output on the client's behalf
  and whatever the server does not bound, it buffers.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from urllib.parse import urlsplit

from loraplex.bench.serve.attack_kinds import (
    FANOUT_N,
    KindPlan,
    KindTarget,
    Tally,
    long_stream,
)

STUCK_STREAMS = 8
STUCK_TOP_LOGPROBS = 20  # the server's maximum: the widest chunk per token
STUCK_RCVBUF_BYTES = 4096  # asked for; Linux doubles it and keeps a floor of a few KB
CONNECT_TIMEOUT_S = 10.0  # a connect not accepted by then counts as failed and is retried
# Before reopening a socket the server closed, or retrying a failed connect: sockets beyond a
# server's connection cap are closed as soon as accepted, and reopening them in a tight loop
# would spend the 2 shared cores on the attacking client (whose CPU the victims would then
# blame on the server) rather than on the server.
REOPEN_PAUSE_S = 0.05
# The flood's own source address on loopback (an attacker connects from its address, the victims
# from theirs: 127.0.0.1). NOTE: a flood from the victims' own address is, to a per-address
# limit, the victims themselves; docs/operations.md "Connections and floods" says what that costs.
FLOOD_SOURCE_HOST = "127.0.0.2"


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def partial_head(host: str, port: int) -> bytes:
    """A request head cut before its end: no credentials, no blank line."""
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
        "Content-Type: application/json\r\nContent-Length: 64\r\n"
    ).encode("latin-1")


async def half_open_flood(target: KindTarget, plan: KindPlan, stop: asyncio.Event) -> Tally:
    host, port = _address(target.url)
    head = partial_head(host, port)
    tally = {"sockets": plan.flood_sockets, "opened": 0, "closed_by_server": 0,
             "connect_failed": 0, "open_at_stop": 0, "peak_open": 0}  # fmt: skip
    open_now = 0

    async def hold() -> None:
        nonlocal open_now
        # NOTE: not ``while True``: Python 3.11's wait_for can swallow a cancellation (gh-86296),
        # and a holder that missed its cancel would then reconnect forever.
        while not stop.is_set():
            try:
                source = (FLOOD_SOURCE_HOST, 0) if host == "127.0.0.1" else None
                connect = asyncio.open_connection(host, port, local_addr=source)
                reader, writer = await asyncio.wait_for(connect, CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError):
                tally["connect_failed"] += 1
                await asyncio.sleep(REOPEN_PAUSE_S)
                continue
            tally["opened"] += 1
            open_now += 1
            tally["peak_open"] = max(tally["peak_open"], open_now)
            try:
                writer.write(head)
                while await reader.read(4096):  # whatever the server answers, until it closes
                    pass
            except OSError:
                pass  # a reset: closed by the server too
            finally:
                open_now -= 1
                writer.close()
            tally["closed_by_server"] += 1
            await asyncio.sleep(REOPEN_PAUSE_S)

    holders = [asyncio.create_task(hold()) for _ in range(plan.flood_sockets)]
    await stop.wait()
    tally["open_at_stop"] = open_now
    for task in holders:
        task.cancel()
    await asyncio.wait(holders, timeout=CONNECT_TIMEOUT_S)  # each ends at its next await
    return tally


def stuck_request(target: KindTarget, plan: KindPlan, index: int) -> bytes:
    """The raw bytes of one stuck stream's request."""
    host, port = _address(target.url)
    fields = {"n": FANOUT_N, "logprobs": STUCK_TOP_LOGPROBS}
    body = long_stream(plan, index, **fields).body
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"Authorization: Bearer {target.key}\r\n\r\n"
    )
    return head.encode("latin-1") + body


async def _open_stuck(target: KindTarget, request: bytes) -> socket.socket:
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # Before connect: the window the client advertises is fixed at the handshake.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, STUCK_RCVBUF_BYTES)
        sock.setblocking(False)
        await asyncio.wait_for(loop.sock_connect(sock, _address(target.url)), CONNECT_TIMEOUT_S)
        await loop.sock_sendall(sock, request)
    except BaseException:
        sock.close()
        raise
    return sock


async def stuck_streams(target: KindTarget, plan: KindPlan, stop: asyncio.Event) -> Tally:
    """Opens the stuck streams and holds them, unread, until ``stop``."""
    held: list[socket.socket] = []
    failed = 0
    try:
        for index in range(STUCK_STREAMS):
            try:
                held.append(await _open_stuck(target, stuck_request(target, plan, index)))
            except (OSError, TimeoutError):
                failed += 1
        rcvbuf = held[0].getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) if held else None
        await stop.wait()
    finally:
        for sock in held:
            with contextlib.suppress(OSError):
                sock.close()
    return {"streams": len(held), "connect_failed": failed, "rcvbuf_bytes": rcvbuf}
