"""``bench fleet --topology``'s transition poller: it reads the fleet board and ``/admin/fleet``
every ``POLL_S`` from the start of the warm-up, and gives the times (seconds from the measured
replay's start; negative: during the warm-up) at which a replica's merged revision changed and at
which the first ``merged`` routing decision was counted (``Timeline``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from loraplex.bench.harness.stats import ratio

POLL_S = 1.0  # the transition poller's period


@dataclass
class Timeline:
    """What the poller saw: (t_s, replica, merged revision) on every change of a replica's
    merged revision, and when the first ``merged`` routing decision was counted."""

    merges: list[dict[str, Any]] = field(default_factory=list)
    first_merged_decision_s: float | None = None
    transitions: dict[str, Any] = field(default_factory=dict)  # histograms at the end


class TransitionPoller:
    """Polls the board and ``/admin/fleet`` on a thread every ``POLL_S`` (both sides alike)."""

    def __init__(self, url: str, admin_key: str) -> None:
        self._url, self._admin_key = url, admin_key
        self._stop = threading.Event()
        self._seen: dict[str, str | None] = {}
        self._events: list[tuple[float, str, str | None]] = []
        self._first_merged: float | None = None
        self._modes: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TransitionPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30.0)

    def _run(self) -> None:
        from loraplex.bench.fleet.cluster import board_entries, fleet_state

        while not self._stop.is_set():
            now = time.monotonic()
            try:
                for entry in board_entries():
                    mode = getattr(entry.status.get("load"), "mode", None)
                    merged = None if mode is None else mode.merged_revision
                    rid = str(entry.replica_id)
                    if mode is not None:
                        self._modes[rid] = mode
                    known = rid in self._seen
                    if (known and self._seen[rid] != merged) or (not known and merged):
                        self._events.append((now, rid, merged))
                    self._seen[rid] = merged
                decisions = fleet_state(self._url, self._admin_key)["decisions"]
                if self._first_merged is None and decisions.get("merged", 0) > 0:
                    self._first_merged = now
            except Exception:  # a read that fails is retried at the next tick
                pass
            self._stop.wait(POLL_S)

    def timeline(self, start: float) -> Timeline:
        """Times relative to ``start`` (the measured replay's start), rounded to 0.1 s."""
        replicas = sorted(self._seen)
        names = {rid: f"r{i}" for i, rid in enumerate(replicas)}
        merges = [
            {"t_s": round(t - start, 1), "replica": names.get(rid, rid), "merged": merged}
            for t, rid, merged in self._events
        ]
        first = self._first_merged
        transitions = {
            names.get(rid, rid): {
                "merges": mode.merge.num_observed,
                "unmerges": mode.unmerge.num_observed,
                "merge_ms_mean": ratio(1000 * mode.merge.sum_s, mode.merge.num_observed, 2),
            }
            for rid, mode in self._modes.items()
        }
        return Timeline(merges, None if first is None else round(first - start, 1), transitions)
