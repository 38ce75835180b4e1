"""uvicorn's h11 protocol, bounded (``BoundedH11Protocol``), and the uvicorn config that hands it
its limits and the listener's connection gate (``ListenerConfig``).

Every accepted connection is bounded (``ConnectionLimits``): TCP_NODELAY (asyncio sets it only on
sockets whose ``proto`` is IPPROTO_TCP, and ``socket.create_server`` leaves it 0, so responses on
a reused connection waited out the client's delayed ACK, ~40 ms), the gate of ``connections.py``
(connections in all, per address, not yet authenticated, and accepted per second per address), a
deadline for each request head, an idle keep-alive timeout, a largest request head and most
header lines (whole or not, counted before h11 parses them: ``h11_bounds.py``), and a pace at
which a client must take a waiting answer: less than ``min_send_bytes_per_s`` over a span of
``write_timeout_s``, or the slowest when all waiting answers pass ``max_unsent_response_bytes``,
and it is cut off with a reset (``unsent.py``), which ends its request (a stream's engine
request is aborted, its seat, KV blocks and adapter lease freed). Body limits are
the app's (``server/limits.py``); a connection answered mid-body closes in stages
(``linger.py``).

A client that shuts its sending side after a whole request (a half-close: ``shutdown(SHUT_WR)``,
``nc -N``, some proxies) is still answered, and the connection closes after the answer: RFC 9112
§9.6 (httpwg/http-core#431) says a half-close neither ends a request nor means the client lost
interest in the response; uvicorn took that EOF for a disconnect. A half-closed connection is
bounded as an open one is (write timeout, no keep-alive after the answer). Its EOF looks the same
as a full close's, so before any byte of the answer the client is sent an interim ``100
Continue``: a client that closed answers it with a reset, polled every ``RESET_POLL_S``, and its
request ends (as a stream's does at the first write that fails). An EOF with no whole request in
flight closes the connection at once, as before.
"""

from __future__ import annotations

import asyncio
import fcntl
import http
import socket
import sys
import termios
from typing import Any

import h11
import uvicorn
from prometheus_client.registry import CollectorRegistry
from uvicorn.protocols.http.h11_impl import H11Protocol

from loraplex.clock import MonotonicClock
from loraplex.server.connections import MARK_AUTHENTICATED, MAX_WAITING, ConnectionGate
from loraplex.server.fd_limit import ensure_fd_limit
from loraplex.server.gate_metrics import GateCollector
from loraplex.server.gated_accept import AcceptGate, refuse
from loraplex.server.listeners.buffered import BUFFERED_ANSWERS, BufferedAnswers
from loraplex.server.listeners.h11_bounds import BoundedConnection
from loraplex.server.listeners.limits import ConnectionLimits
from loraplex.server.listeners.linger import LingeringTransport
from loraplex.server.listeners.unsent import (
    MALFORMED,
    ListenerCollector,
    ListenerCounts,
    SendWatch,
    UnsentLedger,
)
from loraplex.server.tarpit import Tarpit

# How often a half-closed connection whose answer is not yet written is checked for a reset (the
# client gone): no read can see one after the EOF, and no write happens before the answer.
RESET_POLL_S = 0.5
# Linux TCP states (``tcpi_state``, the first byte of TCP_INFO): reset by the peer; its side shut.
_TCP_CLOSE, _TCP_CLOSE_WAIT = 7, 8


class ListenerConfig(uvicorn.Config):
    """uvicorn's config for ``app`` with ``limits`` (uvicorn hands protocols only its config),
    and the one connection gate of this listener."""

    def __init__(
        self,
        app: Any,
        limits: ConnectionLimits,
        log_level: str = "info",
        metrics: CollectorRegistry | None = None,
        access_log: bool = True,
    ) -> None:
        # NOTE: no ``limit_concurrency``: at its cap uvicorn answers every request 503, those
        # of authenticated tenants on connections already open too; the gate bounds connections.
        # NOTE: ``ws="none"``: loraplex serves no WebSocket route, and uvicorn upgraded any
        # request asking for one (``Upgrade: websocket``, no credential needed) to its
        # WebSocket protocol, handing the connection over without this protocol's
        # ``connection_lost``: the gate never released it, and about 500 such requests, each
        # answered 403 and closed, left the gate full for good (no connection admitted, /health
        # included). The request is now answered as any other (``_should_upgrade``).
        super().__init__(
            app,
            http=GatedH11Protocol,
            ws="none",
            lifespan="off",
            log_level=log_level,
            access_log=access_log,
            timeout_keep_alive=limits.keep_alive_timeout_s,
            h11_max_incomplete_event_size=limits.max_header_bytes,
        )
        self.limits = limits
        self.gate = ConnectionGate(limits.gate(), MonotonicClock())
        self.tarpit = Tarpit()  # connections held off (``tarpit.py``)
        # answers waiting for slow clients, all connections together (``unsent.py``)
        self.unsent = UnsentLedger(
            limits.max_unsent_response_bytes, limits.write_timeout_s, MonotonicClock()
        )
        self.counts = ListenerCounts()  # requests refused by the parser, connections cut
        # fd_limit.py: connections held off (``tarpit.py``) or waiting for room (``connections.py``)
        ensure_fd_limit(limits.max_connections, self.tarpit.max_held + MAX_WAITING)
        if metrics is not None:  # the app's /metrics registry
            metrics.register(GateCollector(self.gate, self.tarpit))
            metrics.register(ListenerCollector(self.counts, self.unsent))


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, bounded: TCP_NODELAY, the connection gate, a request-head
    deadline, a pace to take a waiting answer.

    A connection the gate does not admit is reset as soon as it is accepted, before anything of
    it is read. The head deadline starts when a connection opens or, on a kept-alive one, at the
    first byte of the next request; uvicorn's own keep-alive timer covers the idle time between
    requests. The pace is watched while the transport holds more than its high-water mark of
    unsent bytes (uvicorn's flow control then stops the response's writer: ``stream_buffer.py``).
    """

    def __init__(self, config: uvicorn.Config, *, accepted: bool = False, **kwargs: Any) -> None:
        if not isinstance(config, ListenerConfig):
            raise TypeError(f"config {type(config).__name__} is invalid; expected ListenerConfig")
        super().__init__(config, **kwargs)
        # NOTE: uvicorn turns its access log off by emptying the logger's handlers, which a
        # later config in the same process (a test's) puts back; this listener's own flag holds
        self.access_log = self.access_log and config.access_log
        self.limits = config.limits
        limits = self.limits
        self.conn = BoundedConnection(
            limits.max_header_bytes, limits.max_body_chunks, limits.max_header_count
        )
        self.gate = config.gate
        self.counts = config.counts
        self._send_watch = SendWatch(
            self, config.unsent, self.loop, limits.write_timeout_s, limits.min_send_bytes_per_s
        )
        self._accepted = accepted  # the accept token is taken (``GatedH11Protocol``)
        # answer bytes the app holds for this client beyond the transport (``buffered.py``)
        self.buffered = BufferedAnswers(self._send_watch.changed)
        # every request's scope state: how the credential check marks this connection, and
        # where a stream counts what it buffers
        self.app_state = {
            **self.app_state,
            MARK_AUTHENTICATED: self._on_authenticated,
            BUFFERED_ANSWERS: self.buffered,
        }
        self._head_timer: asyncio.TimerHandle | None = None
        self._half_closed = False  # the client shut its sending side (``eof_received``)
        self._reset_timer: asyncio.TimerHandle | None = None  # half-closed: polls for a reset
        self._active_at = self.loop.time()  # last byte received or answer completed
        self._draining = False  # the gate asked it to close after its next answer
        self._body_due_at: float | None = None  # the head of a request whose body is due

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        lingering = LingeringTransport(transport, self, self.limits.linger_s)
        super().connection_made(lingering)  # type: ignore[arg-type]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.limits.send_buffer_bytes)
        admit = self.gate.admit_accepted if self._accepted else self.gate.admit
        if not admit(self, self.client[0] if self.client else ""):
            refuse(transport)
            return
        self._watch_head()

    def is_idle(self) -> bool:
        """No request in flight (``connections.Member``)."""
        return self.cycle is None or self.cycle.response_complete

    def quiet_s(self) -> float | None:
        """Seconds since the last byte received or answer completed, when idle and nothing of a
        next request is parsed or buffered (``connections.Member``)."""
        if not self.is_idle() or self.transport.is_closing():
            return None
        if self.conn.their_state is not h11.IDLE or self.conn.trailing_data[0]:
            return None  # part of the next request is here: it must be answered
        return self.loop.time() - self._active_at

    def _bytes_waiting(self) -> bool:
        """Bytes the client sent that the loop has not read yet (FIONREAD on the socket)."""
        return self._socket_queue(termios.FIONREAD) > 0

    def _socket_queue(self, request: int) -> int:
        """Bytes in one of the socket's queues (``FIONREAD``: received, unread; ``TIOCOUTQ``:
        sent, not acknowledged); 0 when there is no socket."""
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return 0
        try:
            queued = fcntl.ioctl(sock.fileno(), request, b"\0\0\0\0")
        except OSError:
            return 0
        return int.from_bytes(queued, sys.byteorder)

    def evict(self) -> bool:
        """Closed by the gate for a newcomer, unless a request waits unread in the socket
        (``connections.Member``)."""
        if self._bytes_waiting():
            return False
        self.transport.close()
        return True

    def drain(self) -> None:
        """Close after the answer in flight, or the next one (``connections.Member``): it says
        ``Connection: close``, as uvicorn's graceful shutdown does to busy connections."""
        self._draining = True
        self._close_after_cycle()

    def receiving_s(self) -> float | None:
        """Seconds since the head of the request whose body is still due, nothing of its
        answer sent (``connections.Member``)."""
        cycle, due_at = self.cycle, self._body_due_at
        if due_at is None or cycle is None or cycle.response_started:
            return None
        return None if self.transport.is_closing() else self.loop.time() - due_at

    def hold(self) -> bool:
        """Waits for room, nothing of it read (``connections.Member``)."""
        self.flow.pause_reading()
        return True

    def let_in(self) -> None:
        """Admitted after waiting: its request is read (``connections.Member``)."""
        if not self.transport.is_closing():
            self.flow.resume_reading()

    def gone(self) -> bool:
        """Its client reset it, or shut its side with nothing sent before (``connections.Member``,
        asked of a waiting newcomer, which reads nothing: its end shows only in the TCP state).
        NOTE: seen otherwise only at its head deadline, it held a waiting place until then."""
        sock = self.transport.get_extra_info("socket")
        if self.transport.is_closing() or sock is None:
            return self.transport.is_closing()
        tcp_info = getattr(socket, "TCP_INFO", None)  # Linux only
        if tcp_info is None:
            return False  # the state cannot be read here: seen at the head deadline, as before
        try:
            state = sock.getsockopt(socket.IPPROTO_TCP, tcp_info, 1)[0]
        except OSError:
            return False  # not TCP: never taken for gone
        return state == _TCP_CLOSE or (state == _TCP_CLOSE_WAIT and not self._bytes_waiting())

    def cut_body(self) -> None:
        """Closed with a reset by the gate for a newcomer, its request's body still due
        (``connections.Member``): the app sees a disconnect, as for any client gone."""
        refuse(self.transport)

    def _close_after_cycle(self) -> None:
        cycle = self.cycle
        if not self._draining or cycle is None or cycle.response_complete:
            return  # idle: the next request's cycle is marked as it starts (``handle_events``)
        cycle.keep_alive = False
        if not cycle.response_started:  # h11 then closes after the answer too
            cycle.default_headers = [*cycle.default_headers, (b"connection", b"close")]

    def handle_events(self) -> None:
        super().handle_events()
        self._close_after_cycle()
        if self.conn.their_state is not h11.SEND_BODY:
            self._body_due_at = None
        elif self._body_due_at is None:
            self._body_due_at = self.loop.time()

    def _on_authenticated(self, tenant: str | None = None) -> bool:
        return self.gate.authenticated(self, tenant)

    def _should_upgrade(self) -> bool:
        """Never: an ``Upgrade`` header is ignored (RFC 9110 §7.8 lets a server), and the
        request answered over HTTP/1.1. uvicorn's own logged two warnings for each such request,
        the second telling the operator to install a WebSocket library (``ListenerConfig``)."""
        return False

    def pause_writing(self) -> None:
        super().pause_writing()
        self._send_watch.paused()

    def resume_writing(self) -> None:
        self._send_watch.resumed()
        super().resume_writing()

    def unsent_bytes(self) -> int:
        """Answer bytes the client's kernel has not acknowledged (``unsent.Holder``): those the
        transport holds and those in the socket's send queue (``TIOCOUTQ``). NOTE: the transport
        alone measured the client's pace in bursts: a client whose kernel buffers took
        megabytes read steadily at 64 KiB/s while the transport gave nothing for 5 s."""
        return int(self.transport.get_write_buffer_size()) + self._socket_queue(termios.TIOCOUTQ)

    def held_bytes(self) -> int:
        """``unsent_bytes`` plus what the app holds for this client beyond the transport
        (``unsent.Holder``; ``buffered.py``)."""
        return self.unsent_bytes() + self.buffered.num_bytes()

    def cut(self, reason: str) -> None:
        """Closed with a reset for a client too slow to take its answer (``unsent.Holder``).
        NOTE: a reset, not close (which would wait to flush what the client does not take) nor
        a plain abort (the kernel would go on handing the client what its send buffer holds)."""
        self.counts.cut(reason)
        refuse(self.transport)

    def data_received(self, data: bytes) -> None:
        if isinstance(self.transport, LingeringTransport) and self.transport.lingering:
            return  # the rest of a body already answered: dropped
        self._active_at = self.loop.time()
        super().data_received(data)
        self._watch_head()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's 400 for a request h11 refused (counted as ``MALFORMED``: it was not
        counted), or, when this connection refused it, its status (431: too many header lines)
        and text, counted by the bound's setting."""
        conn = self.conn
        if not isinstance(conn, BoundedConnection) or conn.refusal_setting is None:
            self.counts.refused(MALFORMED)
            super().send_400_response(msg)
            return
        self.counts.refused(conn.refusal_setting)
        status = conn.refusal_status
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")]
        reason = http.HTTPStatus(status).phrase.encode()
        for event in (
            h11.Response(status_code=status, headers=headers, reason=reason),
            h11.Data(data=(conn.refusal or msg).encode()),
            h11.EndOfMessage(),
        ):
            self.transport.write(conn.send(event))
        self.transport.close()

    def on_response_complete(self) -> None:
        if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
            # Answered before its body ended: uvicorn would read the rest only to discard it,
            # and a client sending it slowly would hold the connection for as long as it likes.
            self.transport.close()
        self._active_at = self.loop.time()
        super().on_response_complete()
        if self._half_closed and not self.transport.is_closing():
            if self._answering():  # a pipelined request started
                self._close_after_answers()
            else:  # nothing more can come
                self.transport.close()

    def eof_received(self) -> bool:  # type: ignore[override]
        """The client shut its sending side: the whole requests it sent are still answered (True
        keeps the write side open), then the connection closes; otherwise it closes now."""
        if not self._answering() or self.transport.is_closing():
            return False  # idle, mid-head, mid-body, lingering: nothing can be answered
        self._half_closed = True
        self._close_after_answers()
        self._probe()
        if self._reset_timer is None:
            self._reset_timer = self.loop.call_later(RESET_POLL_S, self._poll_reset)
        return True

    def _probe(self) -> None:
        """Tells a client that closed from one that only half-closed, before any byte of the
        answer: an interim ``100 Continue`` (RFC 9110 §15.2: a client must parse 1xx it did not
        expect) is taken by a half-closed client and answered with a reset by a closed one,
        which ``_poll_reset`` then sees. None to HTTP/1.0, which must not get a 1xx."""
        cycle = self.cycle
        if cycle.response_started or cycle.scope["http_version"] != "1.1":
            return
        probe = h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")
        self.transport.write(self.conn.send(probe))
        cycle.waiting_for_100_continue = False

    def _answering(self) -> bool:
        """A whole request is in flight, its answer not complete."""
        cycle = self.cycle
        return cycle is not None and not cycle.response_complete and not cycle.more_body

    def _close_after_answers(self) -> None:
        """Half-closed: the request in flight closes the connection once answered, unless a
        pipelined one waits behind it (``on_response_complete`` starts that one)."""
        if not self.conn.trailing_data[0]:
            self.cycle.keep_alive = False

    def _poll_reset(self) -> None:
        self._reset_timer = None
        if self.transport.is_closing():
            return
        sock = self.transport.get_extra_info("socket")
        if sock is not None and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self.transport.abort()  # reset by the client: it is gone, its request ends
            return
        self._reset_timer = self.loop.call_later(RESET_POLL_S, self._poll_reset)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        self._send_watch.stopped()
        if self._reset_timer is not None:
            self._reset_timer.cancel()
            self._reset_timer = None
        self.gate.release(self)
        super().connection_lost(exc)

    def _reading_head(self) -> bool:
        """A request head is due: none complete yet, and not idle between requests."""
        return self.conn.their_state is h11.IDLE and self.timeout_keep_alive_task is None

    def _watch_head(self) -> None:
        if not self._reading_head() or self.transport.is_closing():
            self._stop_head_timer()
        elif self._head_timer is None:
            timeout_s = self.limits.header_read_timeout_s
            self._head_timer = self.loop.call_later(timeout_s, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._reading_head() and not self.transport.is_closing():
            self.transport.close()


class GatedH11Protocol(AcceptGate):
    """The listener's protocol class: the accept-rate check (``gated_accept.py``), then a
    ``BoundedH11Protocol`` for a connection within the rate."""

    def __init__(self, config: uvicorn.Config, **kwargs: Any) -> None:
        if not isinstance(config, ListenerConfig):
            raise TypeError(f"config {type(config).__name__} is invalid; expected ListenerConfig")
        super().__init__(
            config.gate,
            lambda: BoundedH11Protocol(config, accepted=True, **kwargs),
            config.tarpit,
        )
