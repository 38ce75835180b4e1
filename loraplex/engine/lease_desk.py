"""What the engine does before the scheduler plans a step: the residency phases.

``LeaseDesk.advance`` runs them in this order, once per step:

1. **rebalance**: automatic warm promotion/demotion (``cache.rebalance``), at most once per
   ``rebalance_interval_s`` of the clock; between runs it costs a clock read.
2. **expire**: queued requests past their deadline end with ``QueueTimeoutError``.
3. **collect**: lease futures that completed since the last step are settled (the request
   holds its lease, or ends with the load's error); abandoned futures that completed release
   their lease.
4. **request**: the scheduler's lease candidates ask the cache for their adapter; a lease not
   granted at once leaves its request in ADAPTER_WAIT with the future in its ``Live`` record.
   A candidate whose adapter's GPU copy is borrowed room that another tenant's load waits for
   (``TieredAdapterCache.reclaiming``) does not ask this step: it stays queued, so the copy's
   leases drain and the waiting load reclaims it.
   Leases whose adapter was in host memory (L1: only the copy into a slot is left) are waited
   for, all together, at most ``MAX_COPY_WAIT_S``, and settled at once when they came: the copy
   needs the slot lock, which the step's forward would otherwise take first, so the request
   would sit out that whole step (and the copy could wait out several forwards for the lock).
5. **prefetch**: the adapters of the queued requests just past the lease window load to L1,
   each charged to its requests' tenant (``Scheduler.prefetch_keys``), as their leases will be.

The desk changes no request's state itself: the scheduler does (``wait_for_adapter``,
``on_lease``, ``on_lease_failed``), and a request the desk ends is retired by the core
(``retire``). A cold adapter costs its own requests a wait, never anyone else a step: at most
``MAX_COPY_WAIT_S`` of one, for a copy from host memory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Future, wait

from loraplex.artifacts.identity import AdapterKey
from loraplex.clock import Clock
from loraplex.engine.live import Live
from loraplex.engine.request import Request
from loraplex.engine.sched.admission import AdapterLoads
from loraplex.engine.sched.scheduler import Scheduler
from loraplex.engine.trace_log import TraceLog
from loraplex.errors import QueueTimeoutError
from loraplex.residency.cache import Lease, TieredAdapterCache
from loraplex.residency.ledger import Tier

# Ends a live request as ABORTED with this error (the core's retire; engine thread).
Retire = Callable[[Request, BaseException], None]

_log = logging.getLogger(__name__)

# How long a step waits for the leases of adapters copied from host memory (L1) into a slot
# before it plans without them. Such a copy took 1.1-2.5 ms in the large preset's r16 trace
# (rank 16 on q/k/v/o, 16 layers: 6.8 MB) on a shared 2-core machine, where the step it would
# otherwise sit out took 0.1-2.5 s (docs/benchmarks/peer.md, "Large-preset trace tail"). Only a
# copy under way is waited for (``is_moving``): one queued behind the load bounds or blocked for
# room may take any time, and waiting for it cost a load-bound trace a 20 ms stall per step
# (the simulator's cold-scarce case lost a third of its completions before that check).
MAX_COPY_WAIT_S = 0.02


class LeaseDesk:
    """Deadlines, adapter leases, prefetches and warm rebalancing, advanced once per step."""

    def __init__(
        self,
        scheduler: Scheduler,
        cache: TieredAdapterCache | None,
        clock: Clock,
        *,
        lives: Mapping[str, Live],
        retire: Retire,
        wake: Callable[[], None],
        rebalance_interval_s: float | None,
    ) -> None:
        self.scheduler = scheduler
        self.cache = cache
        self.clock = clock
        self._lives = lives  # the core's records (read here; only the core adds and removes)
        self._retire = retire
        self._wake = wake  # called on a cache worker thread when a lease future completes
        self._orphans: list[Future[Lease]] = []  # abandoned lease futures, released when done
        # the prefetch window's loads, each with the tenant it is charged to
        self._prefetching: dict[AdapterKey, tuple[Future[None], str]] = {}
        self._rebalance_interval_s = rebalance_interval_s  # None: no automatic warm policies
        self._rebalance_at_s = clock.now() + (rebalance_interval_s or 0.0)

    def advance(self) -> None:
        """The five phases, in the module docstring's order."""
        self._rebalance()
        self._expire()
        self._collect()
        self._request()
        self._prefetch()

    def orphan(self, future: Future[Lease]) -> None:
        """A retired request's unfinished lease future: released once it completes."""
        self._orphans.append(future)

    def close(self) -> None:
        """Release every abandoned lease when its load completes (the engine is going away)."""
        for future in self._orphans:
            future.add_done_callback(_release_if_granted)
        self._orphans.clear()

    def _rebalance(self) -> None:
        interval = self._rebalance_interval_s
        if interval is None or self.cache is None or self.clock.now() < self._rebalance_at_s:
            return
        self._rebalance_at_s = self.clock.now() + interval
        try:
            changes = self.cache.rebalance()
        except Exception:  # warm placement is an optimisation: it must never fail requests
            _log.exception("automatic warm rebalance failed")
            return
        for key, warm in changes.items():
            _log.info("adapter %s: automatic warm policy now %s", key.ref, warm.value)

    def _expire(self) -> None:
        now = self.clock.now()
        for req in self.scheduler.expired(now):
            retry = self.scheduler.config.retry_hint_s
            self._retire(req, QueueTimeoutError(req.request_id, now - req.arrival_s, retry))

    def _collect(self) -> None:
        for live in list(self._lives.values()):
            future = live.lease_future
            if future is not None and future.done():
                live.lease_future = None
                self._settle(live, future)
        self._orphans = [f for f in self._orphans if not _release_if_granted(f)]

    def _request(self) -> None:
        cache = self.cache
        if cache is None:
            return
        copies: list[Live] = []  # waiting leases whose adapter is in host memory
        for req in self.scheduler.lease_candidates(self._adapter_loads()):
            key = req.request.adapter_key
            assert key is not None  # lease candidates use an adapter
            if cache.reclaiming(key):  # borrowed room another tenant waits for: not this step
                continue
            remaining = max(req.deadline_at_s - self.clock.now(), 1e-3)
            in_memory = cache.is_resident(key, Tier.L1)  # before the lease: it may move
            future = cache.acquire_future(
                key,
                deadline_s=remaining,
                requester=req.tenant,
                traffic=not req.request.probe,  # a release's probe: no tenant's demand
            )
            live = self._lives[req.request_id]
            if future.done():
                self._settle(live, future)
                continue
            self.scheduler.wait_for_adapter(req)
            if req.trace_log is not None:
                req.trace_log.defer(self.clock.now())
            live.lease_future = future
            future.add_done_callback(self._on_done(req.trace_log))
            if in_memory and cache.is_moving(key):  # queued or blocked for room: no wait
                copies.append(live)
        self._await_copies(copies)

    def _await_copies(self, copies: list[Live]) -> None:
        """Waits, at most MAX_COPY_WAIT_S in all, for the leases of ``copies`` (copies from host
        memory into a slot) and settles those that came, so their requests run in this step."""
        futures = [live.lease_future for live in copies if live.lease_future is not None]
        if not futures:
            return
        wait(futures, timeout=MAX_COPY_WAIT_S)
        for live in copies:
            future = live.lease_future
            if future is not None and future.done():
                live.lease_future = None
                self._settle(live, future)

    def _on_done(self, log: TraceLog | None) -> Callable[[Future[Lease]], None]:
        """A waiting lease's callback (on the loader's thread): stamps when its load completed
        in a recorded request's log, then wakes the engine."""

        def done(_: Future[Lease]) -> None:
            if log is not None:
                log.ready(self.clock.now())
            self._wake()

        return done

    def _settle(self, live: Live, future: Future[Lease]) -> None:
        req = live.req
        error = future.exception()
        if error is not None:
            if req.trace_log is not None:
                req.trace_log.lease_failed(self.clock.now(), error)
            self._retire(req, self.scheduler.on_lease_failed(req, error))
            return
        lease = future.result()
        if req.output_token_ids:  # a resumed request's lease again (``Scheduler.pause``)
            self.scheduler.on_lease(req, lease)
            return
        live.lease_tier = lease.load.source
        if req.trace_log is not None:
            load = lease.load
            stages = {str(stage): s for stage, s in load.seconds.items()}
            req.trace_log.leased(self.clock.now(), load.source, stages, load.room_wait_s)
        self.scheduler.on_lease(req, lease)

    def _prefetch(self) -> None:
        if self.cache is None:
            return
        window = self.scheduler.prefetch_keys()
        fresh = {k: t for k, t in window.items() if k not in self._prefetching}
        kept = {k: self._prefetching[k] for k in window if k in self._prefetching}
        for key in self.scheduler.admit_prefetches(fresh, self._adapter_loads()):
            kept[key] = (self.cache.prefetch(key, Tier.L1, requester=fresh[key]), fresh[key])
        self._prefetching = kept

    def _adapter_loads(self) -> AdapterLoads:
        cache = self.cache
        assert cache is not None  # only asked for by an engine with an adapter cache
        in_flight = {k: t for k, (f, t) in self._prefetching.items() if not f.done()}
        return AdapterLoads(lambda key: cache.is_resident(key, Tier.L0), in_flight)


def _release_if_granted(future: Future[Lease]) -> bool:
    """Release the lease of a finished, abandoned future; True once the future is done."""
    if not future.done():
        return False
    if not future.cancelled() and future.exception() is None:
        future.result().release()
    return True
