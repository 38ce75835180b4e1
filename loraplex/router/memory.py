"""The router's memory of its own decisions since each replica's last report.

Reports come about once a second; a burst of requests for one cold revision arrives within
milliseconds. Without this memory every request of the burst would see the revision absent
everywhere and the replicas equally idle, and the burst would spread its cold loads over the
fleet. With it, a request routed to replica r for revision a makes a count as "loading on r"
and adds one waiting request (and its prompt tokens) to r's load, until a report from r
newer than the decision, or ``recent_ttl_s``, says otherwise.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Pending:
    """What the router sent to one replica that its latest report cannot yet reflect."""

    num_requests: int  # requests routed there since the report, not ended yet
    num_tokens: int  # their prompt tokens
    adapter_keys: frozenset[str]  # revisions they asked for (ended ones' too)


NO_PENDING = Pending(0, 0, frozenset())  # one object, so a view built on it can be reused

Entry = tuple[float, str | None, int]  # one decision: (when, revision, prompt tokens)


@dataclass
class _Log:
    """Decisions for one replica in time order, with running totals (amortized O(1) upkeep)."""

    entries: deque[Entry] = field(default_factory=deque)
    num_tokens: int = 0
    per_key: dict[str, int] = field(default_factory=dict)
    # each entry kept, counted (equal entries are one key): ``finish`` asks it in O(1)
    kept: Counter[Entry] = field(default_factory=Counter)
    # entries whose request ended (``finish``): they still name their revision, as no load
    done: Counter[Entry] = field(default_factory=Counter)
    num_done: int = 0
    # ``pending()``'s answer while no entry came or went since (None: to be rebuilt)
    pending: Pending | None = None

    def drop_before(self, cutoff_s: float) -> None:
        while self.entries and self.entries[0][0] < cutoff_s:
            self._uncount(self.entries.popleft())

    def remove(self, entry: Entry) -> None:
        """Drops ``entry`` (or one equal to it: the same totals) if it has not lapsed yet."""
        try:
            self.entries.remove(entry)
        except ValueError:
            return
        self._uncount(entry)

    def finish(self, entry: Entry) -> None:
        """``entry`` (or one equal to it) stops counting as load, if it has not lapsed yet."""
        # NOTE: ``self.entries.count(entry)`` scanned every decision kept for the replica (all
        # of the last ``recent_ttl_s`` when its reports stop) at every request's end
        if self.kept.get(entry, 0) <= self.done.get(entry, 0):
            return  # lapsed (a report newer than it came), or every equal one ended already
        self.done[entry] += 1
        self.num_done += 1
        self.num_tokens -= entry[2]
        self.pending = None

    def _uncount(self, entry: Entry) -> None:
        _, key, tokens = entry
        kept = self.kept[entry] - 1
        if kept:
            self.kept[entry] = kept
        else:
            del self.kept[entry]
        ended = self.done.get(entry, 0)
        if ended:
            if ended == 1:
                del self.done[entry]
            else:
                self.done[entry] = ended - 1
            self.num_done -= 1
        else:
            self.num_tokens -= tokens
        self.pending = None
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
        """Remembers a decision; returns its entry (for ``withdraw``)."""
        log = self._logs.get(replica_id)
        if log is None:  # NOTE: not ``setdefault(replica_id, _Log())``: a _Log per decision
            log = self._logs[replica_id] = _Log()
        entry = (at_s, adapter_key, num_tokens)
        log.entries.append(entry)
        log.kept[entry] += 1
        log.num_tokens += num_tokens
        log.pending = None
        if adapter_key is not None:
            log.per_key[adapter_key] = log.per_key.get(adapter_key, 0) + 1
        return entry

    def withdraw(self, replica_id: str, entry: Entry) -> None:
        """Forgets a decision ``record`` returned (the request was routed again elsewhere); a
        no-op once it lapsed or its replica left. NOTE: O(decisions kept for the replica)."""
        log = self._logs.get(replica_id)
        if log is not None:
            log.remove(entry)

    def finish(self, replica_id: str, entry: Entry) -> None:
        """A decision ``record`` returned whose request ended (its replica answered it all):
        it no longer adds a request or its tokens to the replica's load, but still names its
        revision (the replica loaded it) until it lapses. A no-op once it lapsed. NOTE: a
        request that ended before its replica's next report counted as waiting until then, so a
        tenant sending short requests back to back (each done in milliseconds) made replicas
        look saturated that were all but idle (docs/benchmarks/attackfleet2.md). O(1)."""
        log = self._logs.get(replica_id)
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
        if log.entries and log.entries[0][0] < cutoff_s:
            log.drop_before(cutoff_s)
        if log.pending is None:
            num_requests = len(log.entries) - log.num_done
            log.pending = Pending(num_requests, log.num_tokens, frozenset(log.per_key))
        return log.pending

    def first_s(self, replica_id: str) -> float | None:
        """When the oldest decision kept for ``replica_id`` was made (None: none kept): the
        earliest it may lapse is ``recent_ttl_s`` after it."""
        log = self._logs.get(replica_id)
        return log.entries[0][0] if log is not None and log.entries else None

    def forget_except(self, replica_ids: set[str]) -> None:
        """Drops replicas that left the fleet, so memory stays bounded by the fleet's size."""
        for gone in [r for r in self._logs if r not in replica_ids]:
            del self._logs[gone]
