"""Each replica's latest routing report, decoded once per report the replica makes.

A replica numbers its reports (``SEQ_KEY`` next to the encoded report, in its routing stats and
in its board status: ``replica.EngineReplica``); a reader keeps the last report it decoded per
replica with its number, and decodes again only when the number changes. NOTE: both readers
look at every replica's latest report for every request (the Ray request router at each
decision, ``FleetCache.is_resident`` at each request's arrival tier): decoding them each time
made a request's cost grow with the fleet's size times the reports' size. A report is known by
its number alone, never by its content (comparing content costs what decoding does).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Collection, Iterator

from loraplex.errors import quoted
from loraplex.router.reports import MalformedReportError, ReplicaReport, decode_report

SEQ_KEY = "report_seq"  # the routing stats (and board status) key holding the report's number
MAX_SEQ = 2**63 - 1


def report_numbers() -> Iterator[int]:
    """One replica's report numbers, each once: from its host's monotonic clock in ns when the
    replica is made, so one made again under the same id on the same host repeats none (Ray
    never gives two replicas one id)."""
    return itertools.count(time.monotonic_ns())


class DecodedReports:
    """The latest decoded report (or refusal) per replica, with its number; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # replica id -> (number, its report; None: refused)
        self._latest: dict[str, tuple[int, ReplicaReport | None]] = {}

    def decode(self, replica_id: str, seq: object, payload: object) -> ReplicaReport | None:
        """The report ``payload`` encodes, decoded only if ``seq`` is not the number of the one
        decoded last for ``replica_id``. Raises ``MalformedReportError`` when that report is
        refused (a bad number or payload, another replica's id), the first time only: None at
        every later look at the same number."""
        known = self._latest.get(replica_id)
        if known is not None and type(seq) is int and known[0] == seq:
            return known[1]
        if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq <= MAX_SEQ:
            # NOTE: not remembered (no number to know it by): refused at every look
            raise MalformedReportError(SEQ_KEY, f"is {quoted(seq)}; expected 0..{MAX_SEQ}")
        try:
            report = decode_report(payload)
            if report.replica_id != replica_id:
                raise MalformedReportError(
                    "replica_id", f"is {quoted(report.replica_id)}; expected {quoted(replica_id)}"
                )
        except MalformedReportError:
            self._remember(replica_id, seq, None)
            raise
        self._remember(replica_id, seq, report)
        return report

    def forget_except(self, replica_ids: Collection[str]) -> None:
        """Drops the reports of replicas not in ``replica_ids`` (they left the fleet)."""
        with self._lock:
            for gone in [r for r in self._latest if r not in replica_ids]:
                del self._latest[gone]

    def _remember(self, replica_id: str, seq: int, report: ReplicaReport | None) -> None:
        with self._lock:
            self._latest[replica_id] = (seq, report)
