"""What the server process has in flight in its engine child: streams waiting for deltas, calls
waiting for their reply, pin/prefetch loads waiting for their ``done``.

The IO thread routes the child's messages here (``messages.py`` lists them); when the
child dies, everything in flight fails at once and nothing of it is carried to the next child.
When it is declared hung, the streams whose request has had no output yet fail at once (they
cannot be served soon); a request's ``n`` siblings count as one (``prefix_leader``): once one
of them has output, the response has begun and none of them is cut.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from concurrent.futures import Future
from typing import Any

from loraplex.engine.protocol import TokenDelta
from loraplex.engine.transport.messages import LoadDone, Reply, StepOut
from loraplex.engine.transport.packed_errors import unpack_error
from loraplex.engine.transport.streams import Mailbox, Outbox


class InFlight:
    """Request id -> stream and call id -> future, for one engine child at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[str, tuple[Mailbox, Outbox]] = {}
        self._group_of: dict[str, str] = {}  # live stream -> its request's group (its siblings)
        self._group_size: Counter[str] = Counter()  # live streams per group
        self._started: set[str] = set()  # groups of which a stream had output
        self._calls: dict[int, Future[Any]] = {}  # waiting for their reply
        self._deferred: dict[int, Future[None]] = {}  # pin/prefetch: waiting for their load
        self._call_ids = itertools.count()

    @property
    def num_pending(self) -> int:
        """Streams and calls waiting on the child (a load after its reply is not: the engine
        loop turns while it runs)."""
        with self._lock:
            return len(self._streams) + len(self._calls)

    def add_stream(self, rid: str, mailbox: Mailbox, outbox: Outbox, group: str) -> None:
        """``group``: the request's siblings share one (``prefix_leader``, else ``rid``)."""
        with self._lock:
            if rid in self._streams:
                raise ValueError(f"request_id {rid!r} is invalid; expected unique")
            self._streams[rid] = (mailbox, outbox)
            self._group_of[rid] = group
            self._group_size[group] += 1

    def _forget(self, rid: str) -> None:
        """Forgets a live stream (under the lock)."""
        del self._streams[rid]
        group = self._group_of.pop(rid)
        self._group_size[group] -= 1
        if self._group_size[group] <= 0:
            del self._group_size[group]
            self._started.discard(group)

    def drop_stream(self, rid: str, outbox: Outbox) -> bool:
        """Forgets ``rid``'s stream; False when ``outbox`` was not the live one (a duplicate id,
        or a stream already failed with its child)."""
        with self._lock:
            if self._streams.get(rid, (None, None))[1] is not outbox:
                return False
            self._forget(rid)
            return True

    def add_call(self, deferred: Future[None] | None) -> tuple[int, Future[Any]]:
        """A new call id and the future of its reply; ``deferred`` completes at its ``done``."""
        future: Future[Any] = Future()
        with self._lock:
            call_id = next(self._call_ids)
            self._calls[call_id] = future
            if deferred is not None:  # before the call is sent: "done" follows its reply
                self._deferred[call_id] = deferred
        return call_id, future

    def end_call(self, call_id: int, answered: bool) -> None:
        """The caller stopped waiting; an unanswered call's load is not waited for either."""
        with self._lock:
            self._calls.pop(call_id, None)
            if not answered:
                self._deferred.pop(call_id, None)

    def on_reply(self, reply: Reply) -> None:
        """A call's answer: its result, or its error (then its load is not waited for)."""
        with self._lock:
            future = self._calls.pop(reply.call_id, None)
            if not reply.ok:
                self._deferred.pop(reply.call_id, None)
        if future is None:
            return
        if reply.ok:
            future.set_result(reply.value)
        else:
            future.set_exception(unpack_error(reply.value))

    def on_load_done(self, done: LoadDone) -> None:
        """A pin's or prefetch's load finished."""
        with self._lock:
            deferred = self._deferred.pop(done.call_id, None)
        if deferred is None:
            return
        if done.error is None:
            deferred.set_result(None)
        else:
            deferred.set_exception(unpack_error(done.error))

    def on_step_out(self, out: StepOut) -> None:
        """One engine step's deltas and errors, handed to their streams' event loops."""
        touched: set[Mailbox] = set()
        with self._lock:
            for rid, item in out.items:
                stream = self._streams.get(rid)
                if stream is None:  # aborted by its client meanwhile
                    continue
                mailbox, outbox = stream
                if isinstance(item, TokenDelta):
                    self._started.add(self._group_of[rid])
                value = item if isinstance(item, TokenDelta) else unpack_error(item)
                mailbox.post(outbox, value)
                touched.add(mailbox)
        for mailbox in touched:
            mailbox.wake()

    def fail_all(self, error: BaseException) -> None:
        """Every stream and call in flight fails with ``error`` and is forgotten."""
        with self._lock:
            streams = list(self._streams.values())
            futures = [*self._calls.values(), *self._deferred.values()]
            self._streams.clear()
            self._group_of.clear()
            self._group_size.clear()
            self._started.clear()
            self._calls.clear()
            self._deferred.clear()
        for mailbox, outbox in streams:
            mailbox.post(outbox, error)
            mailbox.wake()
        for future in futures:
            if not future.done():
                future.set_exception(error)

    def fail_unstarted(self, error: BaseException) -> list[str]:
        """Every stream whose request (siblings included) has had no output yet fails with
        ``error`` and is forgotten; their ids (the child still has them: abort them)."""
        with self._lock:
            unstarted = [r for r in self._streams if self._group_of[r] not in self._started]
            failed = [(rid, self._streams[rid]) for rid in unstarted]
            for rid in unstarted:
                self._forget(rid)
        for _, (mailbox, outbox) in failed:
            mailbox.post(outbox, error)
            mailbox.wake()
        return unstarted
