"""At ``max_connections`` a newcomer takes the place of the largest tenant's idle connection; a
client that sends a request on that connection as the eviction happens must not lose it (a
non-idempotent POST cannot be retried blindly).

The races are made deterministic by ordering, not by sleeps: the test waits until the server
holds the request's bytes (in h11's buffer, or unread in the socket with reading paused through
the server's loop) before the newcomer connects. Then that connection is not closed: another one
is (the quietest), or, when none may be, the oldest is told to close after its answer
(``Connection: close``) and the newcomer is refused."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from conftest import Served
from test_connections import FakeMember, _gate, _gate_of, serving

from loraplex.server.listeners import BoundedH11Protocol, ConnectionLimits

WAIT_S = 5.0
POST_BODY = json.dumps({"model": "support", "prompt": "hi", "max_tokens": 2}).encode()


def _head(method: str, path: str, key: str, length: int = 0) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: loraplex", f"Authorization: Bearer {key}"]
    if method == "POST":
        lines += ["Content-Type: application/json", f"Content-Length: {length}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _post(key: str) -> bytes:
    return _head("POST", "/v1/completions", key, len(POST_BODY)) + POST_BODY


def _answer(sock: socket.socket) -> tuple[int, dict[str, str]]:
    """Status and headers of one answer read whole from ``sock``; (0, {}) when it was closed
    (or reset) first."""
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return 0, {}
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        while len(body) < int(headers.get("content-length", "0")):
            chunk = sock.recv(65536)
            if not chunk:
                return 0, {}
            body += chunk
    except (ConnectionResetError, BrokenPipeError):
        return 0, {}
    return int(lines[0].split()[1]), headers


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def _wait(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "the server did not get there"
        time.sleep(0.005)


@contextmanager
def _hog(served: Served, limits: ConnectionLimits) -> Iterator[tuple[tuple[str, int], list[Any]]]:
    """A server whose every connection (``max_connections``) acme holds, authenticated and idle:
    yields its address and [the uvicorn server, acme's sockets, oldest first]."""
    with serving(served, limits) as (host, port, server):
        held = []
        for _ in range(limits.max_connections):
            sock = socket.create_connection((host, port), timeout=WAIT_S)
            sock.sendall(_head("GET", "/v1/models", served.keys["acme"]))
            assert _answer(sock)[0] == 200
            held.append(sock)
        gate = _gate_of(server)
        _wait(lambda: gate.num_open == limits.max_connections)
        try:
            yield (host, port), [server, *held]
        finally:
            for sock in held:
                sock.close()


def _protocol_of(server: Any, sock: socket.socket) -> BoundedH11Protocol:
    """The server's side of ``sock``."""
    port = sock.getsockname()[1]
    (found,) = [m for m in _gate_of(server)._open if getattr(m, "client", (0, 0))[1] == port]
    assert isinstance(found, BoundedH11Protocol)
    return found


def _newcomer(address: tuple[str, int], served: Served) -> int:
    """The status a new connection's request gets; 0 when it was refused (reset or closed),
    which may reach the client as early as its connect (seen once in CI)."""
    try:
        sock = socket.create_connection(address, timeout=WAIT_S)
    except ConnectionResetError:
        return 0
    try:
        sock.sendall(_head("GET", "/v1/models", served.keys["globex"]))
        return _answer(sock)[0]
    except (ConnectionResetError, BrokenPipeError):
        return 0
    finally:
        sock.close()


def test_a_request_partly_received_on_the_victim_is_answered(served: Served) -> None:
    limits = ConnectionLimits(max_connections=2, max_connections_per_address=8)
    with _hog(served, limits) as (address, (server, first, second)):
        request = _post(served.keys["acme"])
        first.sendall(request[:20])  # the oldest idle one: the victim before this change
        proto = _protocol_of(server, first)
        _wait(lambda: bool(proto.conn.trailing_data[0]))
        assert _newcomer(address, served) == 200
        first.sendall(request[20:])
        status, _ = _answer(first)
        assert status == 200  # answered, not dropped
        assert _closed(second)  # the quiet one made room
        assert _gate_of(server).num_evicted == 1


def test_a_request_waiting_in_the_socket_is_answered(served: Served) -> None:
    """The request's bytes reached the server's socket but the loop has not read them yet."""
    limits = ConnectionLimits(max_connections=2, max_connections_per_address=8)
    with _hog(served, limits) as (address, (server, first, second)):
        proto = _protocol_of(server, first)
        paused = []
        proto.loop.call_soon_threadsafe(lambda: (proto.transport.pause_reading(), paused.append(1)))
        _wait(lambda: bool(paused))
        first.sendall(_post(served.keys["acme"]))
        _wait(proto._bytes_waiting)  # in the server's socket, not read
        assert _newcomer(address, served) == 200
        proto.loop.call_soon_threadsafe(proto.transport.resume_reading)
        assert _answer(first)[0] == 200
        assert _closed(second)


def test_with_requests_arriving_on_every_connection_the_oldest_closes_after_its_answer(
    served: Served,
) -> None:
    limits = ConnectionLimits(max_connections=2, max_connections_per_address=8)
    with _hog(served, limits) as (address, (server, first, second)):
        request = _post(served.keys["acme"])
        for sock in (first, second):
            sock.sendall(request[:20])
            proto = _protocol_of(server, sock)
            _wait(lambda p=proto: bool(p.conn.trailing_data[0]))  # type: ignore[misc]
        newcomer = socket.create_connection(address, timeout=WAIT_S)
        newcomer.sendall(_head("GET", "/v1/models", served.keys["globex"]))
        gate = _gate_of(server)
        _wait(lambda: gate.num_waiting == 1)  # nobody may be closed: it waits, unread
        assert (gate.num_evicted, gate.num_drained, gate.num_open) == (0, 1, 2)
        first.sendall(request[20:])  # answered, saying it closes, then closed
        status, headers = _answer(first)
        assert (status, headers.get("connection")) == (200, "close")
        assert _closed(first)
        assert _answer(newcomer)[0] == 200  # main: reset at accept; now the drained one's place
        newcomer.close()
        _wait(lambda: gate.num_open == 1)
        second.sendall(request[20:])  # the other one is answered and kept alive
        status, headers = _answer(second)
        assert status == 200 and headers.get("connection") != "close"
        assert _newcomer(address, served) == 200  # the newcomer's place, closed after it


def test_the_gate_closes_the_quietest_connection_and_drains_one_when_none_may_close() -> None:
    gate, _ = _gate(max_connections=5, max_unauthenticated_connections=5)
    hog = [FakeMember(quiet=0.1), FakeMember(quiet=None), FakeMember(quiet=3.0, unread=True),
           FakeMember(quiet=2.0)]  # fmt: skip
    for member in hog:
        assert gate.admit(member, "a")
        gate.authenticated(member, "acme")
    other = FakeMember(quiet=None)
    assert gate.admit(other, "b")
    gate.authenticated(other, "globex")
    newcomer = FakeMember(quiet=None)
    assert gate.admit(newcomer, "c")  # the quietest one that has no request waiting
    assert [m.evicted for m in hog] == [False, False, False, True]
    assert gate.num_evicted == 1
    gate.authenticated(newcomer, "initech")
    newcomer = FakeMember(quiet=None)
    assert gate.admit(newcomer, "c")
    gate.authenticated(newcomer, "initech")
    assert [m.evicted for m in hog] == [True, False, False, True]
    for member in hog[1:3]:
        member.quiet, member.unread = None, False  # requests in flight on the last two
    assert not gate.admit(FakeMember(), "c")  # nobody to close: the oldest one is drained
    drained = [m.drained for m in hog]
    assert drained == [False, True, False, False] and gate.num_drained == 1
    assert not gate.admit(FakeMember(), "c")  # the next one, not the same one again
    assert hog[2].drained and gate.num_drained == 2
    gate.release(hog[1])  # its answer sent, it closed
    assert gate.admit(FakeMember(), "c")
