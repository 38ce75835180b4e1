"""``listeners.unsent.UnsentLedger``: the answers waiting for slow clients, all connections
together, at most ``max_bytes``; past it the slowest connection that has shown its pace is cut,
else the newcomer; one answer alone always fits. (Through the real listener:
``test_slow_answer.py``.)"""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.server.listeners.unsent import CUT_UNSENT_BYTES, UnsentLedger

MIN_AGE_S = 30.0


@dataclass
class Clock:
    t: float = 0.0

    def now(self) -> float:
        return self.t


@dataclass(eq=False)
class Conn:
    """A connection whose client has taken ``taken`` of what it held."""

    held: int
    taken: int = 0
    cut_for: str | None = None
    buffered: int = 0  # what its app holds beyond the transport (a stream's events)

    def unsent_bytes(self) -> int:
        return self.held - self.taken

    def held_bytes(self) -> int:
        return self.unsent_bytes() + self.buffered

    def cut(self, reason: str) -> None:
        self.cut_for = reason


def _hold(ledger: UnsentLedger, conn: Conn) -> Conn:
    ledger.hold(conn, conn.held_bytes())
    return conn


def test_past_the_cap_the_slowest_shown_connection_is_cut() -> None:
    clock = Clock()
    ledger = UnsentLedger(10_000, MIN_AGE_S, clock)
    fast, slow = _hold(ledger, Conn(4000)), _hold(ledger, Conn(4000))
    clock.t = MIN_AGE_S
    fast.taken, slow.taken = 3000, 10
    newcomer = _hold(ledger, Conn(5000))  # 1000 + 3990 + 5000 fits once measured again
    assert ledger.num_bytes == 9990 and not any(c.cut_for for c in (fast, slow, newcomer))
    another = _hold(ledger, Conn(2500))  # 12,490: the slowest of those held 30 s goes
    cuts = [c.cut_for for c in (slow, fast, newcomer, another)]
    assert cuts == [CUT_UNSENT_BYTES, None, None, None]
    assert ledger.num_bytes == 1000 + 5000 + 2500 and len(ledger) == 3
    last = _hold(ledger, Conn(4000))  # fast alone has shown its pace: cut, then the newcomer
    cuts = [c.cut_for for c in (fast, newcomer, another, last)]
    assert cuts == [CUT_UNSENT_BYTES, None, None, CUT_UNSENT_BYTES]
    assert ledger.num_bytes == 5000 + 2500


def test_with_none_shown_the_newcomer_is_cut_and_one_alone_always_fits() -> None:
    clock = Clock()
    ledger = UnsentLedger(10_000, MIN_AGE_S, clock)
    alone = _hold(ledger, Conn(50_000))
    assert alone.cut_for is None and ledger.num_bytes == 50_000
    second = _hold(ledger, Conn(100))
    assert (alone.cut_for, second.cut_for) == (None, CUT_UNSENT_BYTES)
    ledger.release(alone)
    assert ledger.num_bytes == 0 and len(ledger) == 0


def test_what_a_held_connection_buffers_counts_and_its_growth_cuts_past_the_cap() -> None:
    """A stream hands its transport one slice at a time: its other unread events wait in the
    app. Before, the ledger counted the slice alone, so streams of echo events unread added up
    past the cap with nothing cut (attack round 17)."""
    clock = Clock()
    ledger = UnsentLedger(10_000, MIN_AGE_S, clock)
    slow = _hold(ledger, Conn(1000, buffered=6000))
    assert ledger.num_bytes == 7000
    clock.t = MIN_AGE_S
    stream = _hold(ledger, Conn(1000))
    assert ledger.num_bytes == 8000 and not any(c.cut_for for c in (slow, stream))
    stream.buffered = 4000  # its next echo events
    ledger.changed(stream, stream.held_bytes())
    assert (slow.cut_for, stream.cut_for) == (CUT_UNSENT_BYTES, None)
    assert ledger.num_bytes == 5000
    ledger.changed(Conn(1), 50_000)  # not held: nothing to count
    assert ledger.num_bytes == 5000 and len(ledger) == 1
