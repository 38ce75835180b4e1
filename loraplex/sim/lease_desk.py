"""What a simulated replica does before its scheduler plans a step: the residency phases, as
``engine.lease_desk.LeaseDesk`` runs them on a live engine (that module's docstring), on the
virtual clock.

``SimLeaseDesk.advance`` runs them in the engine's order: rebalance (at most once per
``auto_warm_interval_s``), then, while a request is queued, expire, collect, request and
prefetch; with nothing queued the last four have nothing to do, so only their one effect is
kept: the prefetch window empties. Leases whose adapter was in host memory (L1: only the copy
into a slot is left) are the engine's ``_await_copies``: the replica waits for them, all
together, at most ``MAX_COPY_WAIT_S`` of virtual time before it plans, and those that came are
settled for that step (``await_copies``). A candidate whose adapter's GPU copy is borrowed room
that another tenant's load waits for (``TieredAdapterCache.reclaiming``) asks for no lease that
step, as in the engine's request phase. Any other lease that waited for a load reaches its
request after the cost model's hand-off for the tier it came from (``lease_handoff_s``;
``_hand_over``). A lease that misses the GPU slots first holds the engine thread the cost
model's ``lease_ask_s``: the request phase stops there, its load is asked for when the ask ends,
and the phase goes on with the next candidate (``asking``/``after_asks``; the replica plans
nothing meanwhile). The desk changes no request's state itself: the scheduler does, and a
request it ends is retired by the replica (``retire``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from functools import partial

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.lease_desk import MAX_COPY_WAIT_S
from loraplex.engine.request import Request
from loraplex.engine.sched.admission import AdapterLoads
from loraplex.engine.sched.scheduler import Scheduler
from loraplex.errors import QueueTimeoutError
from loraplex.residency.cache import Lease, SimExecutor, TieredAdapterCache
from loraplex.residency.ledger import Tier
from loraplex.residency.stats import Stage
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
        ask_s: float = 0.0,
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
        self._copies: list[str] = []  # this step's pending leases of adapters in host memory
        # The cost model's lease hand-off per source tier ({}: none), and when each pending
        # request's completed lease reaches it (the engine collects it from then on).
        self._handoff = handoff_s
        self._handed_at: dict[str, float] = {}
        # The cost model's lease_ask_s, and the request phase's candidates left while a miss's
        # ask holds the engine thread (None: no ask in progress), the ask's end.
        self._ask_s = ask_s
        self._asking: Iterator[Request] | None = None
        self._ask_ends_s = 0.0
        # the prefetch window's loads, each with the tenant it is charged to
        self._prefetching: dict[AdapterKey, tuple[Future[None], str]] = {}
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
        self._copies = []
        self._request(iter(sched.lease_candidates(self._adapter_loads())), None)
        if not self.asking:  # else after_asks goes on
            self._prefetch()
        return True

    @property
    def asking(self) -> bool:
        """Whether a miss's ask holds the engine thread (``after_asks`` goes on from there)."""
        return self._asking is not None

    def after_asks(self, then: Callable[[], None]) -> None:
        """When the ask in progress ends: asks for that lease, goes on with the request phase
        (each further miss asked after the ones before it) and the prefetch, then ``then``."""
        self._executor.call_at(self._ask_ends_s, partial(self._asked, then))

    def _asked(self, then: Callable[[], None]) -> None:
        rest, self._asking = self._asking, None
        assert rest is not None  # after_asks is called while asking
        first = next(rest, None)
        self._request(rest, first)
        if self.asking:  # the next miss's ask
            self.after_asks(then)
            return
        self._prefetch()
        then()

    def abandon(self, request_id: str) -> None:
        """``request_id`` ends: a lease it still waits for is released once granted."""
        future = self._pending.pop(request_id, None)
        self._handed_at.pop(request_id, None)
        if future is not None:
            future.add_done_callback(_release_if_granted)

    def await_copies(self, then: Callable[[], None]) -> bool:
        """``LeaseDesk._await_copies`` on the virtual clock: if this step asked for leases whose
        adapter was in host memory, waits for them (``_CopyWait``), settles those that came in
        time, so their requests run in this step (no hand-off), then calls ``then``; False, and
        ``then`` is not called, when there is nothing to wait for."""
        pending, copies, self._copies = self._pending, self._copies, []
        if self._ask_s:  # a copy that came during a later miss's ask: the wait finds it done
            self._settle_copies([r for r in copies if r in pending and pending[r].done()])
        waited = {r: pending[r] for r in copies if r in pending and not pending[r].done()}
        if not waited:
            return False
        _CopyWait(self._executor, waited, partial(self._settle_copies, then=then))
        return True

    def _settle_copies(self, granted: list[str], *, then: Callable[[], None] | None = None) -> None:
        for request_id in granted:
            future = self._pending.pop(request_id, None)
            if future is not None:  # else its request ended during the wait
                self._handed_at.pop(request_id, None)
                self._settle(self._scheduler.requests[request_id], future)
        if then is not None:
            then()

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

    def _request(self, candidates: Iterator[Request], asked: Request | None) -> None:
        """The request phase over ``candidates``; ``asked``, whose ask just ended, first. It
        stops at a miss while ``lease_ask_s`` holds the engine thread (``_asking``)."""
        sched = self._scheduler
        for req in candidates if asked is None else itertools.chain((asked,), candidates):
            key = req.request.adapter_key
            if key is None or sched.requests.get(req.request_id) is not req:
                continue  # no adapter, or it ended during an ask
            if self._cache.reclaiming(key):  # as the engine's _request: not this step
                continue
            if self._ask_s and req is not asked and not self._cache.is_resident(key, Tier.L0):
                self._asking = itertools.chain((req,), candidates)
                self._ask_ends_s = self._clock.now() + self._ask_s
                return
            remaining = max(req.deadline_at_s - self._clock.now(), 1e-3)
            in_memory = self._cache.is_resident(key, Tier.L1)  # before the lease: it may move
            future = self._cache.acquire_future(key, deadline_s=remaining, requester=req.tenant)
            if future.done():
                self._settle(req, future)
            else:
                sched.wait_for_adapter(req)
                self._pending[req.request_id] = future
                if in_memory and self._cache.is_moving(key):  # as the engine's _request
                    self._copies.append(req.request_id)
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
        window = sched.prefetch_keys()
        fresh = {k: t for k, t in window.items() if k not in self._prefetching}
        kept = {k: self._prefetching[k] for k in window if k in self._prefetching}
        for key in sched.admit_prefetches(fresh, self._adapter_loads()):
            future = self._cache.prefetch(key, Tier.L1, requester=fresh[key])
            future.add_done_callback(lambda _: self._wake())  # its quota place is free again
            kept[key] = (future, fresh[key])
        self._prefetching = kept

    def _adapter_loads(self) -> AdapterLoads:
        """What the scheduler reads of the cache's copies now (one object while no prefetch is
        in flight: it asks the cache itself)."""
        in_flight = {k: t for k, (f, t) in self._prefetching.items() if not f.done()}
        if not in_flight:
            return self._no_prefetches
        return AdapterLoads(self._no_prefetches.in_gpu, in_flight)


class _CopyWait:
    """One step's wait for its copies from host memory, at most ``MAX_COPY_WAIT_S`` for all
    together. The engine's copies take the slot lock one at a time, while the simulated loads
    may overlap: each copy is charged after the ones before it (``_serial_end_s``), and it is
    granted if that sequential end is within the bound. The wait ends when the last copy's
    sequential end is reached, or at the bound; ``done`` then gets the granted request ids."""

    def __init__(
        self,
        executor: SimExecutor,
        copies: Mapping[str, Future[Lease]],
        done: Callable[[list[str]], None],
    ) -> None:
        self._executor = executor
        self._done = done
        self._start_s = executor.clock.now()
        self._serial_end_s = self._start_s  # when the copies that came would end, in sequence
        self._granted: list[str] = []  # request ids, in the order their copies came
        self._left = len(copies)  # copies yet to come; -1 once the wait ended
        self._timer = executor.call_at(self._start_s + MAX_COPY_WAIT_S, self._end)
        for request_id, future in copies.items():
            future.add_done_callback(partial(self._came, request_id))

    def _came(self, request_id: str, future: Future[Lease]) -> None:
        if self._left <= 0:  # the wait ended: the lease is collected as any other
            return
        self._left -= 1
        copy_s = 0.0  # a failure is settled at once, as the engine's wait settles it
        if not future.cancelled() and future.exception() is None:
            copy_s = future.result().load.seconds.get(Stage.COPY, 0.0)
        self._serial_end_s = max(self._serial_end_s, self._executor.clock.now() - copy_s) + copy_s
        bound_s = self._start_s + MAX_COPY_WAIT_S
        if self._serial_end_s <= bound_s:
            self._granted.append(request_id)
        if not self._left:  # the last one: the wait ends when the copies would have
            self._timer.cancel()
            self._timer = self._executor.call_at(min(self._serial_end_s, bound_s), self._end)

    def _end(self) -> None:
        self._left = -1
        self._done(self._granted)


def _release_if_granted(future: Future[Lease]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().release()
