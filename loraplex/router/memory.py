"""The router's memory of its own decisions since each replica's last report.

Reports come about once a second; a burst of requests for one cold revision arrives within
milliseconds. Without this memory every request of the burst would see the revision absent
everywhere and the replicas equally idle, and the burst would spread its cold loads over the
fleet. With it, a request routed to replica r for revision a makes a count as "loading on r"
and adds one waiting request (and its prompt tokens) to r's load, until a report from r
newer than the decision, or ``recent_ttl_s``, says otherwise.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Pending:
    """What the router sent to one replica that its latest report cannot yet reflect."""

    num_requests: int  # requests routed there since the report, not ended yet
    num_tokens: int  # their prompt tokens
    adapter_keys: frozenset[str]  # revisions they asked for (ended ones' too)


NO_PENDING = Pending(0, 0, frozenset())  # one object, so a view built on it can be reused

# an ``Entry``'s state: kept and load; kept, its request ended (no load, still its revision);
# gone (withdrawn, lapsed, or its replica forgotten): ``withdraw`` and ``finish`` are no-ops
_LOAD, _ENDED, _GONE = 0, 1, 2


class Entry:
    """One decision ``record`` made, its handle for ``withdraw`` and ``finish``: they act on
    this decision only (compared by identity), once. NOTE: entries were (time, revision,
    tokens) tuples matched by value, so withdrawing one twice removed another request's equal
    decision (same instant, revision and tokens: a burst), and withdrawing one whose equal
    twin had ended made the ended one load again."""

    __slots__ = ("adapter_key", "at_s", "num_tokens", "replica_id", "state")

    def __init__(
        self, replica_id: str, at_s: float, adapter_key: str | None, num_tokens: int
    ) -> None:
        self.replica_id = replica_id
        self.at_s = at_s
        self.adapter_key = adapter_key
        self.num_tokens = num_tokens
        self.state = _LOAD

    def __repr__(self) -> str:
        state = ("load", "ended", "gone")[self.state]
        return (
            f"Entry({self.replica_id!r}, {self.at_s!r}, {self.adapter_key!r}, "
            f"{self.num_tokens!r}, {state})"
        )


@dataclass
class _Log:
    """Decisions for one replica in time order, with running totals (amortized O(1) upkeep).
    The oldest entry kept is never a gone one (``_trim``): ``first_s`` reads it."""

    entries: deque[Entry] = field(default_factory=deque)  # gone ones wait here to be popped
    num_kept: int = 0  # entries not gone
    num_tokens: int = 0  # the prompt tokens of those still load
    per_key: dict[str, int] = field(default_factory=dict)  # kept entries per revision
    num_done: int = 0  # kept entries whose request ended (``finish``)
    # ``pending()``'s answer while no entry came or went since (None: to be rebuilt)
    pending: Pending | None = None

    def drop_before(self, cutoff_s: float) -> None:
        entries = self.entries
        while entries and (entries[0].at_s < cutoff_s or entries[0].state == _GONE):
            entry = entries.popleft()
            if entry.state != _GONE:
                self._uncount(entry)

    def remove(self, entry: Entry) -> None:
        """Drops ``entry`` if it is still kept; O(1) amortized."""
        if entry.state == _GONE:
            return
        self._uncount(entry)
        self._trim()

    def finish(self, entry: Entry) -> None:
        """``entry`` stops counting as load, if it is still kept and load; O(1)."""
        # NOTE: ``self.entries.count(entry)`` scanned every decision kept for the replica (all
        # of the last ``recent_ttl_s`` when its reports stop) at every request's end
        if entry.state != _LOAD:
            return  # lapsed (a report newer than it came), withdrawn, or ended already
        entry.state = _ENDED
        self.num_done += 1
        self.num_tokens -= entry.num_tokens
        self.pending = None

    def forget(self) -> None:
        """Its replica left: its entries' ``withdraw`` and ``finish`` become no-ops (a replica
        back under the same id starts a new log, which they must not touch)."""
        for entry in self.entries:
            entry.state = _GONE

    def _trim(self) -> None:
        entries = self.entries
        while entries and entries[0].state == _GONE:
            entries.popleft()

    def _uncount(self, entry: Entry) -> None:
        if entry.state == _ENDED:
            self.num_done -= 1
        else:
            self.num_tokens -= entry.num_tokens
        entry.state = _GONE
        self.num_kept -= 1
        self.pending = None
        key = entry.adapter_key
        if key is not None:
            left = self.per_key[key] - 1
            if left:
                self.per_key[key] = left
            else:
                del self.per_key[key]


class DecisionMemory:
    """Recent decisions per replica; entries older than the replica's report or the TTL lapse."""

    def __init__(self, ttl_s: float) -> None:
        self._ttl_s = ttl_s
        self._logs: dict[str, _Log] = {}

    def record(
        self, replica_id: str, adapter_key: str | None, num_tokens: int, at_s: float
    ) -> Entry:
        """Remembers a decision; returns its entry (for ``withdraw`` and ``finish``)."""
        log = self._logs.get(replica_id)
        if log is None:  # NOTE: not ``setdefault(replica_id, _Log())``: a _Log per decision
            log = self._logs[replica_id] = _Log()
        entry = Entry(replica_id, at_s, adapter_key, num_tokens)
        log.entries.append(entry)
        log.num_kept += 1
        log.num_tokens += num_tokens
        log.pending = None
        if adapter_key is not None:
            log.per_key[adapter_key] = log.per_key.get(adapter_key, 0) + 1
        return entry

    def withdraw(self, replica_id: str, entry: Entry) -> None:
        """Forgets a decision ``record`` returned for ``replica_id`` (the request was routed
        again elsewhere, or left unanswered); a no-op once it was withdrawn, lapsed or its
        replica left. O(1) amortized (it scanned the replica's decisions)."""
        log = self._logs.get(_recorded_for(replica_id, entry))
        if log is not None:
            log.remove(entry)

    def finish(self, replica_id: str, entry: Entry) -> None:
        """A decision ``record`` returned whose request ended (its replica answered it all):
        it no longer adds a request or its tokens to the replica's load, but still names its
        revision (the replica loaded it) until it lapses. A no-op once it ended, was withdrawn,
        lapsed or its replica left. NOTE: a
        request that ended before its replica's next report counted as waiting until then, so a
        tenant sending short requests back to back (each done in milliseconds) made replicas
        look saturated that were all but idle (docs/benchmarks/attackfleet2.md). O(1)."""
        log = self._logs.get(_recorded_for(replica_id, entry))
        if log is not None:
            log.finish(entry)

    def pending(self, replica_id: str, report_at_s: float | None, now_s: float) -> Pending:
        """Decisions for ``replica_id`` made at or after its report (``report_at_s``; None: no
        report) and within the TTL. A decision at the report's very instant still counts: the
        report may have been taken before the request arrived."""
        log = self._logs.get(replica_id)
        if log is None:
            return NO_PENDING
        cutoff_s = now_s - self._ttl_s
        if report_at_s is not None and report_at_s > cutoff_s:
            cutoff_s = report_at_s
        if log.entries and log.entries[0].at_s < cutoff_s:
            log.drop_before(cutoff_s)
        if log.pending is None:
            num_requests = log.num_kept - log.num_done
            log.pending = Pending(num_requests, log.num_tokens, frozenset(log.per_key))
        return log.pending

    def first_s(self, replica_id: str) -> float | None:
        """When the oldest decision kept for ``replica_id`` was made (None: none kept): the
        earliest it may lapse is ``recent_ttl_s`` after it."""
        log = self._logs.get(replica_id)
        return log.entries[0].at_s if log is not None and log.entries else None

    def forget_except(self, replica_ids: set[str]) -> None:
        """Drops replicas that left the fleet, so memory stays bounded by the fleet's size."""
        for gone in [r for r in self._logs if r not in replica_ids]:
            self._logs.pop(gone).forget()


def _recorded_for(replica_id: str, entry: Entry) -> str:
    """``replica_id``, the replica ``entry`` was recorded for; a mark pairing it with another
    replica is a caller's mistake, refused rather than left to touch that replica's totals."""
    if entry.replica_id != replica_id:
        raise ValueError(
            f"entry was recorded for replica {entry.replica_id!r}; withdrawn or finished "
            f"for {replica_id!r}"
        )
    return replica_id
