"""Where the cache's pipeline phases and timers run, outside its lock.

Torch-free. ``ThreadStepExecutor`` runs phases on worker threads and timers on
``threading.Timer`` (the real cache); ``SimExecutor`` orders them as discrete events by
(time, sequence) on a ManualClock, so replays, the simulator and the tests are deterministic.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, TypeVar

from loraplex.clock import Clock, ManualClock
from loraplex.residency.pipeline import Prepared, Resolved

T = TypeVar("T")


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class StepExecutor(Protocol):
    """Runs pipeline phases and timers outside the cache's lock.

    ``run`` must never call ``done`` before returning (no re-entry into the caller), and
    ``done`` receives the work's result or the exception it raised.
    """

    def run(self, work: Callable[[], T], done: Callable[[T | BaseException], None]) -> None: ...

    def call_at(self, when_s: float, fn: Callable[[], None]) -> TimerHandle: ...


class ThreadStepExecutor:
    """Phases on a bounded worker pool; timers on ``threading.Timer`` (the real cache)."""

    def __init__(self, clock: Clock, max_workers: int) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers {max_workers} is invalid; expected >= 1")
        self._clock = clock
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="adapter-load")

    def run(self, work: Callable[[], T], done: Callable[[T | BaseException], None]) -> None:
        def task() -> None:
            try:
                result: T | BaseException = work()
            except Exception as error:
                result = error
            done(result)

        self._pool.submit(task)

    def call_at(self, when_s: float, fn: Callable[[], None]) -> TimerHandle:
        timer = threading.Timer(max(0.0, when_s - self._clock.now()), fn)
        timer.daemon = True
        timer.start()
        return timer

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=False)


class SimTimer:
    """A discrete event's handle: cancelling it skips the event when it comes due.

    It holds the event's callable until the event runs or is cancelled: a cancelled event stays
    in the queue until its time (its place in the order never changes), but what its callable
    reaches is freed at once. NOTE: a waiter's deadline is cancelled as soon as its load
    completes, 30 s early by default; holding the callable kept every such waiter's job, future
    and lease alive for those 30 simulated seconds (hundreds of thousands of objects at a
    scale run's rate, walked by every full garbage collection)."""

    __slots__ = ("cancelled", "fn")

    def __init__(self, fn: Callable[[], None] | None = None) -> None:
        self.cancelled = False
        self.fn = fn

    def cancel(self) -> None:
        self.cancelled = True
        self.fn = None


class SimExecutor:
    """Discrete-event executor: a phase's result is computed at once and delivered after the
    simulated duration it reports; ties break by submission order (deterministic)."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self._events: list[tuple[float, int, SimTimer]] = []
        self._seq = 0

    def run(self, work: Callable[[], T], done: Callable[[T | BaseException], None]) -> None:
        try:
            result: T | BaseException = work()
        except Exception as error:
            result = error
        delay = _duration(result)
        self._push(self.clock.now() + delay, SimTimer(lambda: done(result)))

    def call_at(self, when_s: float, fn: Callable[[], None]) -> SimTimer:
        timer = SimTimer(fn)
        self._push(when_s, timer)
        return timer

    def run_until(self, t_s: float) -> None:
        """Delivers every event due at or before ``t_s``, then sets the clock to ``t_s``."""
        while self._events and self._events[0][0] <= t_s:
            when, _, timer = heapq.heappop(self._events)
            self.clock.advance(max(0.0, when - self.clock.now()))
            fn, timer.fn = timer.fn, None
            if fn is not None:
                fn()
        self.clock.advance(max(0.0, t_s - self.clock.now()))

    def step(self) -> bool:
        """Delivers the next event alone; False when none is left."""
        if not self._events:
            return False
        self.run_until(self._events[0][0])
        return True

    def drain(self) -> None:
        while self._events:
            self.run_until(self._events[0][0])

    def _push(self, when_s: float, timer: SimTimer) -> None:
        self._seq += 1
        heapq.heappush(self._events, (max(when_s, self.clock.now()), self._seq, timer))


def _duration(result: object) -> float:
    """Simulated seconds a phase took: the stage durations it reports (0 for failures)."""
    if isinstance(result, Resolved | Prepared):
        return sum(result.seconds.values())
    if isinstance(result, dict):
        return float(sum(result.values()))
    return 0.0
