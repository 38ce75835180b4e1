"""Response bytes waiting for their clients: one connection's pace (``SendWatch``), all of a
listener's connections together (``UnsentLedger``), and what the listener refused or cut
(``ListenerCounts``).

A connection's answer waits in its transport while its client reads more slowly than the server
writes: a non-streamed answer whole (4.6 MB for 16 echoed prompts of 480 tokens with
``logprobs: 20`` on the demo model), a stream's the writer's slice. ``write_timeout_s`` and
``min_send_bytes_per_s`` bound how long one connection holds it; the ledger bounds all of them
together (``max_unsent_response_bytes``), so clients that each read just fast enough cannot add
up to ``max_connections`` x the largest answer. A connection counts from the moment its transport
holds more than its high-water mark (uvicorn's writer then waits) until it drains or closes; what
it holds is measured as the bytes its client's kernel has not acknowledged: the transport's and
the socket's send queue (``protocol.BoundedH11Protocol.unsent_bytes``), plus what the app holds
for that client beyond the transport (a stream's buffered events, ``buffered.py``: a stream hands
the transport one slice at a time, so the ledger counted only the slice of a stream's answer,
and six unread echo streams held 28 MB beside a cap of 8 MiB); a held connection whose app
buffers more is measured again at once (``UnsentLedger.changed``). A client's pace is what it took
of the transport's and the socket's bytes (``SendWatch``).
When a newly held answer takes the total past the cap, the connections whose clients have taken
their answers most slowly since they were held are cut (a reset) until it fits, among those held
for at least ``write_timeout_s`` (younger ones have shown no pace: their clients first read what
the kernel's buffers took); with none such, the newcomer is cut instead. One answer alone always
fits.

One connection (``SendWatch``): while its transport holds more than the high-water mark, its
client must take, in every span of ``write_timeout_s``, ``min_send_bytes_per_s`` x that span of
its waiting bytes (or all of them, when fewer wait), else it is cut with a reset. nginx's
``send_timeout`` bounds only the time between two writes that take anything, so a client taking
a byte now and then holds its answer for ever; a whole-answer deadline (Go's ``WriteTimeout``)
cuts an honest client of a large answer on a slow link. Before, the timer ran until the
transport drained below its low-water mark, so a non-streamed answer had to be taken whole within
``write_timeout_s`` (4.6 MB in 30 s: 150 KB/s, or the client was cut while reading), and a
cut closed the socket without a reset: the kernel went on handing the slow client what its send
buffer held (up to twice ``send_buffer_bytes``, at the client's pace, minutes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from loraplex.clock import Clock

# Why a connection was cut (``ListenerCounts.num_cut``'s keys)
CUT_WRITE_TIMEOUT = "write_timeout"  # its client took too little for ``write_timeout_s``
CUT_UNSENT_BYTES = "unsent_bytes"  # the slowest when the ledger was over its cap
# The settings whose bounds the HTTP parser refuses requests by (``h11_bounds.py``)
PARSER_SETTINGS = ("max_header_bytes", "max_header_count", "max_body_chunks")
# The ``setting`` label of a request the parser refuses by no setting: framed by both
# Transfer-Encoding and Content-Length (``h11_bounds.py``), uncounted before
BOTH_FRAMINGS = "both_framings"
# The ``setting`` label of a request h11 itself refused as not HTTP/1.1 (a malformed request line
# or header line, an invalid Content-Length or chunk size): uvicorn's bare 400, uncounted before
MALFORMED = "malformed"


class Holder(Protocol):
    """A connection whose transport holds answer bytes (``protocol.BoundedH11Protocol``)."""

    def unsent_bytes(self) -> int:
        """Bytes of its answers its client's kernel has not acknowledged yet."""
        ...

    def held_bytes(self) -> int:
        """Those plus what its app holds for the client beyond the transport (a stream's
        buffered events: ``buffered.py``)."""
        ...

    def cut(self, reason: str) -> None:
        """Closes it with a reset, counted under ``reason``."""
        ...


@dataclass
class _Held:
    """One held connection: what it held when counted, and since when."""

    num_bytes: int  # held bytes (``Holder.held_bytes``) when held (or when last measured)
    initial_bytes: int  # held bytes when held
    since: float  # clock time it was held


class UnsentLedger:
    """The unsent answer bytes of held connections, at most ``max_bytes`` (module docstring).
    Event-loop thread only."""

    def __init__(self, max_bytes: int, min_age_s: float, clock: Clock) -> None:
        self.max_bytes = max_bytes
        self.min_age_s = min_age_s  # held this long, a connection's pace counts
        self._clock = clock
        self._held: dict[Holder, _Held] = {}
        self.num_bytes = 0  # the held connections' held bytes, as last measured

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, holder: object) -> bool:
        return holder in self._held

    def hold(self, holder: Holder, num_bytes: int) -> None:
        """``holder`` waits on its client with ``num_bytes`` held (measured again if it was
        held already: a stream's transport fills once per slice, and it is held since the
        first); past ``max_bytes`` in all, the slowest other held connections are cut, or
        ``holder`` itself while no other has been held ``min_age_s`` (none has shown its pace
        yet)."""
        if holder in self._held:
            self.measured(holder, num_bytes)
        else:
            self._held[holder] = _Held(num_bytes, num_bytes, self._clock.now())
            self.num_bytes += num_bytes
        self._fit(holder)

    def changed(self, holder: Holder, num_bytes: int) -> None:
        """``holder``, held, holds ``num_bytes`` now (its app buffered more of its answers, or
        less); past ``max_bytes`` in all, cut as ``hold`` cuts."""
        if holder in self._held:
            self.measured(holder, num_bytes)
            self._fit(holder)

    def _fit(self, holder: Holder) -> None:
        """The slowest held connections that have shown their pace cut until all fit, else
        ``holder``."""
        if self.num_bytes > self.max_bytes:
            self._remeasure()
        while self.num_bytes > self.max_bytes and len(self._held) > 1:
            now = self._clock.now()
            shown = [
                other
                for other, held in self._held.items()
                if other is not holder and now - held.since >= self.min_age_s
            ]
            slowest = min(shown, key=self._pace) if shown else holder
            self.release(slowest)
            slowest.cut(CUT_UNSENT_BYTES)
            if slowest is holder:
                return

    def release(self, holder: Holder) -> None:
        """``holder`` drained or closed."""
        held = self._held.pop(holder, None)
        if held is not None:
            self.num_bytes -= held.num_bytes

    def measured(self, holder: Holder, num_bytes: int) -> None:
        """``holder``'s held bytes are ``num_bytes`` now."""
        held = self._held.get(holder)
        if held is not None:
            self.num_bytes += num_bytes - held.num_bytes
            held.num_bytes = num_bytes

    def _remeasure(self) -> None:
        """The held connections' held bytes now (their clients took some since)."""
        for holder in self._held:
            self.measured(holder, holder.held_bytes())

    def _pace(self, holder: Holder) -> float:
        """Bytes a second its client took since it was held."""
        held = self._held[holder]
        elapsed_s = max(self._clock.now() - held.since, 1e-9)
        return (held.initial_bytes - held.num_bytes) / elapsed_s


class SendWatch:
    """One connection's pace at taking its waiting answer (module docstring). Event-loop
    thread only."""

    def __init__(
        self,
        holder: Holder,
        ledger: UnsentLedger,
        loop: asyncio.AbstractEventLoop,
        window_s: float,
        min_bytes_per_s: int,
    ) -> None:
        self._holder = holder
        self._ledger = ledger
        self._loop = loop
        self._window_s = window_s
        self._min_window_bytes = max(1, int(min_bytes_per_s * window_s))
        self._timer: asyncio.TimerHandle | None = None
        self._window_bytes = 0  # unsent bytes when the current span began

    def paused(self) -> None:
        """The transport holds more than its high-water mark: the client must keep pace."""
        if self._timer is None:
            self._window_bytes = self._holder.unsent_bytes()
            self._timer = self._loop.call_later(self._window_s, self._window_ended)
            self._ledger.hold(self._holder, self._holder.held_bytes())

    def changed(self) -> None:
        """The app's buffered answers changed: a held connection is measured again, and let
        go once its transport drained and nothing waits in the app."""
        if self._holder not in self._ledger:
            return
        held = self._holder.held_bytes()
        if self._timer is None and held <= self._holder.unsent_bytes():
            self._ledger.release(self._holder)
        else:
            self._ledger.changed(self._holder, held)

    def resumed(self) -> None:
        """The transport drained to its low-water mark: the pace is no longer watched; the
        connection stays held while its app still buffers answer bytes (a stream's next
        slices), measured again."""
        self._stop_timer()
        held = self._holder.held_bytes()
        if held > self._holder.unsent_bytes():
            self._ledger.changed(self._holder, held)
        else:
            self._ledger.release(self._holder)

    def stopped(self) -> None:
        """The connection closed."""
        self._stop_timer()
        self._ledger.release(self._holder)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _window_ended(self) -> None:
        self._timer = None
        unsent = self._holder.unsent_bytes()
        if self._window_bytes - unsent < min(self._min_window_bytes, self._window_bytes):
            self._ledger.release(self._holder)
            self._holder.cut(CUT_WRITE_TIMEOUT)
            return
        self._window_bytes = unsent
        self._ledger.measured(self._holder, self._holder.held_bytes())
        self._timer = self._loop.call_later(self._window_s, self._window_ended)


class ListenerCounts:
    """What a listener refused or cut, for ``/metrics``: requests refused by a bound of the
    HTTP parser (by the setting's name) and connections cut (by ``CUT_*``)."""

    def __init__(self) -> None:
        # setting name -> requests refused by it
        self.num_refused = dict.fromkeys((*PARSER_SETTINGS, BOTH_FRAMINGS, MALFORMED), 0)
        self.num_cut: dict[str, int] = {CUT_WRITE_TIMEOUT: 0, CUT_UNSENT_BYTES: 0}

    def refused(self, setting: str) -> None:
        self.num_refused[setting] += 1

    def cut(self, reason: str) -> None:
        self.num_cut[reason] += 1


class ListenerCollector(Collector):
    """The counts and the ledger at scrape time (``/metrics``)."""

    def __init__(self, counts: ListenerCounts, ledger: UnsentLedger) -> None:
        self._counts = counts
        self._ledger = ledger

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        refused = CounterMetricFamily(
            "loraplex_http_refused",
            "Requests refused by the HTTP parser before the app saw them (a 400 or 431 and a "
            f"close), by the setting that refused them ({BOTH_FRAMINGS}: framed by both "
            f"Transfer-Encoding and Content-Length; {MALFORMED}: not valid HTTP/1.1).",
            labels=("setting",),
        )
        for setting, count in sorted(self._counts.num_refused.items()):
            refused.add_metric((setting,), count)
        yield refused
        cut = CounterMetricFamily(
            "loraplex_connections_cut",
            "Connections cut with a reset while their clients read their answers: too slowly "
            "for write_timeout_s and min_send_bytes_per_s, or the slowest when the unsent "
            "answers passed max_unsent_response_bytes.",
            labels=("reason",),
        )
        for reason, count in sorted(self._counts.num_cut.items()):
            cut.add_metric((reason,), count)
        yield cut
        yield GaugeMetricFamily(
            "loraplex_unsent_response_bytes",
            "Answer bytes waiting for clients that read more slowly than the server writes, in "
            "their transports and socket queues and in their streams' buffers (as last "
            "measured).",
            value=self._ledger.num_bytes,
        )
