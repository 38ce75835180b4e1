"""Load jobs, leases and the executors that run pipeline phases off the cache's lock.

Torch-free. One ``LoadJob`` per adapter key in flight (single flight): every acquirer and
prefetcher of that key attaches a ``Waiter`` to it. Executors decide *where* phases run: worker
threads for the real cache, a discrete-event queue for the replay and the simulator.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from loraplex.artifacts.identity import AdapterKey
from loraplex.clock import Clock
from loraplex.residency.ledger import ResidentEntry, Tier
from loraplex.residency.pipeline import CancelToken, Footprint, LoadResult, Move, Prepared
from loraplex.residency.stats import Stage

if TYPE_CHECKING:
    from loraplex.residency.cache.tiered_cache import TieredAdapterCache

T = TypeVar("T")


class Lease:
    """An adapter held in an L0 slot while a request uses it; release exactly once (idempotent).

    Use as a context manager, or call ``release()``. The slot stays valid until release.
    """

    def __init__(
        self, cache: TieredAdapterCache, key: AdapterKey, slot: int, load: LoadResult
    ) -> None:
        self.key = key  # the adapter revision
        self.slot = slot  # the L0 slot its weights are in
        self.load = load  # how it got there (source tier, per-stage seconds)
        self._cache = cache
        self._released = False
        self._lock = threading.Lock()

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        self._cache.release(self.key)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass
class Waiter:
    """One acquirer or prefetcher of a job."""

    future: Future[Any]  # a Lease for acquirers, None for prefetchers
    wants_lease: bool  # acquirer (needs L0 and a refcount) vs prefetcher
    source: Tier  # the tier it hit (for LoadResult)


@dataclass
class LoadJob:
    """State of one in-flight load (mutated only under the cache's lock)."""

    key: AdapterKey  # the adapter revision
    target: Tier  # the fastest tier any waiter needs
    optional: bool  # prefetch/promotion only: may be refused by the policy, never waits for room
    waiters: list[Waiter] = field(default_factory=list)  # who is waiting
    cancel: CancelToken = field(default_factory=CancelToken)  # set when nobody waits any more
    footprint: Footprint | None = None  # known after resolve
    move: Move | None = None  # the move in progress
    prepared: Prepared | None = None  # staged bytes of the current move
    source_entry: ResidentEntry | None = None  # the copy being read (refcount held)
    reserved: ResidentEntry | None = None  # room taken in move.target, not ready yet
    started: bool = False  # out of the queue (counts against the concurrency bounds)
    blocked_since_s: float | None = None  # waiting for room since
    defer_timer: TimerHandle | None = None  # retries a deferred placement (policy deferral)
    seconds: dict[Stage, float] = field(default_factory=dict)  # accumulated stage durations
    # NOTE: `busy` is True while a phase runs off-lock; deadline expiry then only sets `cancel`
    # and the phase's completion undoes the job.
    busy: bool = False

    def add_seconds(self, seconds: dict[Stage, float]) -> None:
        for stage, value in seconds.items():
            self.seconds[stage] = self.seconds.get(stage, 0.0) + value


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
