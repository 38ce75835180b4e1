"""The live page's history: the last hour of fleet views and traffic, sampled by the server.

The page used to fill its charts only while it was open. Now the server samples what
``/admin/fleet`` shows plus one interval of ``TrafficTally`` every ``interval_s`` into a ring of
``max_samples`` (``length_s / interval_s``, rounded up); ``GET /admin/fleet/history`` returns it
and the page plots it on open, then appends its live polls.

Memory is bounded by the config, not by traffic or tenants: ``max_samples`` samples, each with at
most ``max_replicas`` replicas (the first by id; how many were left out is recorded), the fixed
priority classes and routing reasons, and ``top_revisions`` + 1 revision entries whose names the
registry caps at 3 x 128 characters. With the defaults (360 samples, 16 replicas, 8 revisions)
that is under ``MEMORY_BOUND_BYTES`` (16 MiB; 8.4 MB measured by ``tests/server/test_history.py``
with tracemalloc).

Time is injected: ``clock`` paces the samples and measures each interval; a sample's ``at_s``
is the fleet view's own (unix time).
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

from loraplex.clock import Clock
from loraplex.router.fleet_state import FleetState, FleetStateSource
from loraplex.server.traffic_tally import (
    NO_TRAFFIC,
    RevisionTraffic,
    Traffic,
    TrafficInterval,
    TrafficTally,
)

_log = logging.getLogger(__name__)

MAX_SAMPLES_LIMIT = 100_000  # a config asking for more samples is refused
MEMORY_BOUND_BYTES = 16 << 20  # the history's memory at the defaults, at most (see the tests)


@dataclass(frozen=True)
class HistoryConfig:
    """How much history the server keeps for the live page."""

    interval_s: float = 10.0  # seconds between samples
    length_s: float = 3600.0  # how far back the history reaches
    top_revisions: int = 8  # revisions named per sample and in the window's view
    max_replicas: int = 16  # replicas kept per sample (the first by id)
    max_tracked_revisions: int = 1024  # revisions counted by name within one interval

    def __post_init__(self) -> None:
        if not (math.isfinite(self.interval_s) and self.interval_s > 0):
            raise ValueError(f"interval_s {self.interval_s} is invalid; expected > 0")
        if not (math.isfinite(self.length_s) and self.length_s >= self.interval_s):
            raise ValueError(
                f"length_s {self.length_s} is invalid; expected >= interval_s {self.interval_s}"
            )
        if self.max_samples > MAX_SAMPLES_LIMIT:
            raise ValueError(
                f"length_s / interval_s {self.max_samples} is invalid; expected <= "
                f"{MAX_SAMPLES_LIMIT} samples"
            )
        for name in ("top_revisions", "max_replicas", "max_tracked_revisions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")

    @property
    def max_samples(self) -> int:
        """Samples the ring holds."""
        return math.ceil(self.length_s / self.interval_s - 1e-9)


@dataclass(frozen=True)
class HistorySample:
    """One sample: the fleet as ``/admin/fleet`` showed it, and the traffic since the last."""

    seq: int  # 1, 2, ... in sampling order (the page asks for samples after the last it has)
    interval_s: float  # seconds of traffic ``traffic`` covers
    fleet: FleetState  # the fleet view (at most ``max_replicas`` replicas)
    num_replicas_left_out: int  # replicas the view had beyond ``max_replicas``
    traffic: TrafficInterval  # requests and tokens per class and top revisions

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "at_s": self.fleet.at_s,
            "interval_s": self.interval_s,
            "fleet": self.fleet.to_json(),
            "num_replicas_left_out": self.num_replicas_left_out,
            **self.traffic.to_json(),
        }


class FleetHistory:
    """The ring of samples; ``sample()`` takes one now (``HistorySampler`` calls it on time)."""

    def __init__(
        self, source: FleetStateSource, tally: TrafficTally, config: HistoryConfig, clock: Clock
    ) -> None:
        self.config = config
        self._source = source
        self._tally = tally
        self._clock = clock
        self._lock = threading.Lock()
        self._samples: deque[HistorySample] = deque(maxlen=config.max_samples)
        self._seq = 0
        self._last_s = clock.now()  # when the traffic now counting started

    def sample(self) -> HistorySample:
        """Reads the fleet and drains the tally into a new sample (the oldest may drop out)."""
        state = self._source.fleet_state()
        replicas = tuple(sorted(state.replicas, key=lambda r: r.replica_id))
        kept = replicas[: self.config.max_replicas]
        with self._lock:
            now_s = self._clock.now()
            traffic = self._tally.drain()
            self._seq += 1
            sample = HistorySample(
                seq=self._seq,
                interval_s=now_s - self._last_s,
                fleet=replace(state, replicas=kept),
                num_replicas_left_out=len(replicas) - len(kept),
                traffic=traffic,
            )
            self._last_s = now_s
            self._samples.append(sample)
        return sample

    def samples(self, after_seq: int = 0) -> list[HistorySample]:
        """The kept samples with ``seq`` above ``after_seq``, oldest first."""
        with self._lock:
            return [s for s in self._samples if s.seq > after_seq]

    def to_json(self, after_seq: int = 0) -> dict[str, Any]:
        """What ``GET /admin/fleet/history`` returns: the samples after ``after_seq`` and the
        top revisions over every kept sample."""
        with self._lock:
            kept = list(self._samples)
        top, other, num_other = window_top_revisions(kept, self.config.top_revisions)
        return {
            "interval_s": self.config.interval_s,
            "length_s": self.config.length_s,
            "max_samples": self.config.max_samples,
            "last_seq": kept[-1].seq if kept else 0,  # lower than a client's: a new server
            "samples": [s.to_json() for s in kept if s.seq > after_seq],
            "window": {
                "num_samples": len(kept),
                "seconds": sum(s.interval_s for s in kept),
                "top_revisions": [r.to_json() for r in top],
                "other_revisions": {**other.to_json(), "num_revisions": num_other},
            },
        }


def window_top_revisions(
    samples: list[HistorySample], top_n: int
) -> tuple[tuple[RevisionTraffic, ...], Traffic, int]:
    """The ``top_n`` revisions by tokens summed over ``samples``, the rest summed, and how many
    named revisions that rest holds (a revision outside an interval's top counts there as other,
    so a name's sum is a lower bound and "other" an upper one)."""
    named: dict[str, Traffic] = {}
    other = NO_TRAFFIC
    for sample in samples:
        for entry in sample.traffic.top_revisions:
            named[entry.revision] = named.get(entry.revision, NO_TRAFFIC).plus(entry.traffic)
        other = other.plus(sample.traffic.other_revisions)
    ranked = sorted(named.items(), key=lambda item: (-item[1].tokens, -item[1].requests, item[0]))
    for _, traffic in ranked[top_n:]:
        other = other.plus(traffic)
    top = tuple(RevisionTraffic(name, traffic) for name, traffic in ranked[:top_n])
    return top, other, max(0, len(ranked) - top_n)


class HistorySampler:
    """Takes a sample every ``interval_s`` of ``clock`` time, on a thread of its own.

    ``tick()`` samples when one is due (the thread calls it; tests call it with a manual clock).
    A failed sample is logged and skipped, never fatal: the page shows a gap there.
    """

    def __init__(self, history: FleetHistory, clock: Clock, poll_s: float = 1.0) -> None:
        self._history = history
        self._clock = clock
        self._interval_s = history.config.interval_s
        self._poll_s = min(poll_s, self._interval_s)
        self._due_s = clock.now() + self._interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> bool:
        """Samples if one is due; whether it did."""
        now_s = self._clock.now()
        if now_s < self._due_s:
            return False
        self._due_s += self._interval_s
        if self._due_s <= now_s:  # fell behind (a stalled process): no burst of catch-up samples
            self._due_s = now_s + self._interval_s
        try:
            self._history.sample()
        except Exception:  # e.g. a fleet view that failed: the next one is taken on time
            _log.warning("history: a sample failed", exc_info=True)
            return False
        return True

    @property
    def running(self) -> bool:
        """Whether the sampling thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="loraplex-history", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            self.tick()
