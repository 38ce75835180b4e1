"""What a simulated replica does before its scheduler plans a step: the residency phases, as
``engine.lease_desk.LeaseDesk`` runs them on a live engine (that module's docstring), on the
virtual clock.

``SimLeaseDesk.advance`` runs them in the engine's order: rebalance (at most once per
``auto_warm_interval_s``), then, while a request is queued, expire, collect, request and
prefetch; with nothing queued the last four have nothing to do, so only their one effect is
kept: the prefetch window empties. A lease that waited for a load reaches its request after the
cost model's hand-off for the tier it came from (``lease_handoff_s``; ``_hand_over``). The desk
changes no request's state itself: the scheduler does, and a request it ends is retired by the
replica (``retire``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future
from functools import partial

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.request import Request
from loraplex.engine.sched.admission import AdapterLoads
from loraplex.engine.sched.scheduler import Scheduler
from loraplex.errors import QueueTimeoutError
from loraplex.residency.cache import Lease, SimExecutor, TieredAdapterCache
from loraplex.residency.ledger import Tier
from loraplex.sim.outcome import Outcome

# Ends a live request as ABORTED with this error (the replica's retire).
Retire = Callable[[Request, BaseException], None]


class SimLeaseDesk:
    """Deadlines, adapter leases, prefetches and warm rebalancing of one simulated replica."""

    def __init__(
        self,
        scheduler: Scheduler,
        cache: TieredAdapterCache,
        executor: SimExecutor,
        *,
        outcomes: Mapping[str, Outcome],
        retire: Retire,
        wake: Callable[[], None],
        handoff_s: Mapping[str, float],
        rebalance_interval_s: float | None,
    ) -> None:
        self._scheduler = scheduler
        self._cache = cache
        self._executor = executor
        self._clock = executor.clock
        self._outcomes = outcomes  # the replica's live requests' outcomes (read here)
        self._retire = retire
        self._wake = wake
        self._no_prefetches = AdapterLoads(lambda key: cache.is_resident(key, Tier.L0))
        self._pending: dict[str, Future[Lease]] = {}  # ADAPTER_WAIT requests' lease futures
        # The cost model's lease hand-off per source tier ({}: none), and when each pending
        # request's completed lease reaches it (the engine collects it from then on).
        self._handoff = handoff_s
        self._handed_at: dict[str, float] = {}
        self._prefetching: dict[AdapterKey, Future[None]] = {}
        # Automatic warm rebalancing (the engine's LeaseDesk: once per interval, at a step).
        self.rebalance_interval_s = rebalance_interval_s  # None: no automatic warm policies
        self.rebalance_at_s = self._clock.now() + (rebalance_interval_s or 0.0)

    def advance(self, now: float) -> bool:
        """The phases before a plan (module docstring); whether a request was queued."""
        self._rebalance(now)
        sched = self._scheduler
        if not sched.num_queued:
            self._prefetching = {}
            return False
        retry_s = sched.config.retry_hint_s
        for req in sched.expired(now):
            self._retire(req, QueueTimeoutError(req.request_id, now - req.arrival_s, retry_s))
        self._collect()
        self._request()
        self._prefetch()
        return True

    def abandon(self, request_id: str) -> None:
        """``request_id`` ends: a lease it still waits for is released once granted."""
        future = self._pending.pop(request_id, None)
        self._handed_at.pop(request_id, None)
        if future is not None:
            future.add_done_callback(_release_if_granted)

    def _rebalance(self, now: float) -> None:
        """Automatic warm promotion/demotion, at most once per interval (LeaseDesk._rebalance)."""
        interval = self.rebalance_interval_s
        if interval is None or now < self.rebalance_at_s:
            return
        self.rebalance_at_s = now + interval
        self._cache.rebalance()

    def _collect(self) -> None:
        handed, now = self._handed_at, self._clock.now()
        for request_id, future in list(self._pending.items()):
            if future.done() and (not handed or handed.get(request_id, now) <= now):
                del self._pending[request_id]
                handed.pop(request_id, None)
                self._settle(self._scheduler.requests[request_id], future)

    def _request(self) -> None:
        sched = self._scheduler
        for req in sched.lease_candidates(self._adapter_loads()):
            key = req.request.adapter_key
            if key is None:
                continue
            remaining = max(req.deadline_at_s - self._clock.now(), 1e-3)
            future = self._cache.acquire_future(key, deadline_s=remaining)
            if future.done():
                self._settle(req, future)
            else:
                sched.wait_for_adapter(req)
                self._pending[req.request_id] = future
                if self._handoff:
                    future.add_done_callback(partial(self._hand_over, req.request_id))
                else:
                    future.add_done_callback(lambda _: self._wake())

    def _hand_over(self, request_id: str, future: Future[Lease]) -> None:
        """A waiting lease's load completed: it reaches its request after the cost model's
        hand-off for the tier it was loaded from (a failure at once), then the engine wakes."""
        delay = 0.0
        if not future.cancelled() and future.exception() is None:
            delay = self._handoff.get(future.result().load.source.name, 0.0)
        if request_id in self._pending and delay > 0:
            at = self._clock.now() + delay
            self._handed_at[request_id] = at
            self._executor.call_at(at, self._wake)
            return
        self._wake()

    def _settle(self, req: Request, future: Future[Lease]) -> None:
        error = future.exception()
        if error is not None:
            self._retire(req, self._scheduler.on_lease_failed(req, error))
            return
        lease = future.result()
        outcome = self._outcomes.get(req.request_id)
        if outcome is not None:
            outcome.tier = lease.load.source.name
        self._scheduler.on_lease(req, lease)

    def _prefetch(self) -> None:
        sched = self._scheduler
        window = {k: self._prefetching.get(k) for k in sched.prefetch_keys()}
        fresh = [k for k, f in window.items() if f is None]
        for key in sched.admit_prefetches(fresh, self._adapter_loads()):
            future = self._cache.prefetch(key, Tier.L1)
            future.add_done_callback(lambda _: self._wake())  # its quota place is free again
            window[key] = future
        self._prefetching = {k: f for k, f in window.items() if f is not None}

    def _adapter_loads(self) -> AdapterLoads:
        """What the scheduler reads of the cache's copies now (one object while no prefetch is
        in flight: it asks the cache itself)."""
        in_flight = frozenset(k for k, f in self._prefetching.items() if not f.done())
        if not in_flight:
            return self._no_prefetches
        return AdapterLoads(self._no_prefetches.in_gpu, in_flight)


def _release_if_granted(future: Future[Lease]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().release()
