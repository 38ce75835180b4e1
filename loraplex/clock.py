"""Injected time, so policies and schedulers run unchanged in tests and the simulator."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale (not wall time)."""
        ...


class MonotonicClock:
    """The real clock: ``time.monotonic``."""

    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to (tests, simulator)."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = start_s

    def now(self) -> float:
        return self._now_s

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"seconds {seconds} is invalid; expected >= 0 (time never goes back)")
        self._now_s += seconds
