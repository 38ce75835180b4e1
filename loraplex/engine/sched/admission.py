"""Who may take engine resources next: class seat caps, the cold-load quota and the lease window.

Slots are held by the adapter cache: a queued request is schedulable only once it holds a lease
on its adapter's slot. The lease window bounds how many distinct adapters queued requests (in
fair order) hold or await; within it, a lower priority class leases only what its seats allow
(``class_caps``) and a tenant starts at most ``TenantSettings.max_cold_loads`` adapter loads at
once (``ColdLoadQuota``; a load counts for the tenant it is charged to, ``load_charge``: a caller
of another tenant's public adapter, not its owner). A request held back by either takes no place
in the window and the rest of its tenant's queue is passed over this step: a tenant waiting on its
own bound never keeps the others out, and a storm of one tenant's cold adapters cannot take every
load permit of the cache.
A follower of ``n`` > 1 siblings waits for its leader's prompt (``hold_followers``).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.request import Request, RequestState
from loraplex.engine.sched.fair_order import FairQueues
from loraplex.engine.tenant_shares import TenantBook


@dataclass(frozen=True)
class AdapterLoads:
    """What the engine core knows of adapter copies when the scheduler picks loads."""

    in_gpu: Callable[[AdapterKey], bool]  # a copy is ready in L0: leasing it starts no load
    # prefetches in flight, each with the tenant its load is charged to (``load_charge``)
    prefetching: Mapping[AdapterKey, str] = field(default_factory=dict)


def load_charge(key: AdapterKey, tenants: Iterable[str]) -> str:
    """The tenant a load of ``key`` asked for by the requests of ``tenants`` (in order) counts
    for, as the adapter cache charges it (``acquire_future(requester=)``): the owner when one of
    them is the owner (it would have loaded the adapter anyway), else the first."""
    first = None
    for tenant in tenants:
        if tenant == key.tenant:
            return tenant
        first = first or tenant
    return key.tenant if first is None else first


class ColdLoadQuota:
    """One step's count of each tenant's distinct adapters loading (lease waits and prefetches)
    against its ``max_cold_loads``; a load counts for the tenant it is charged to
    (``load_charge``). Joining a load already counted, or a hit in L0, is free.
    NOTE: counted for the owner, a caller's burst of calls of another tenant's public adapters
    filled the owner's quota: the owner's own cold requests were passed over."""

    def __init__(
        self,
        tenants: TenantBook,
        loading: Iterable[tuple[AdapterKey, str]],
        loads: AdapterLoads,
    ):
        self._tenants = tenants
        self._in_gpu = loads.in_gpu
        asking: dict[AdapterKey, list[str]] = {}
        for key, tenant in (*loading, *loads.prefetching.items()):
            asking.setdefault(key, []).append(tenant)
        self._counted = set(asking)  # keys loading, whoever they count for
        self._loading: dict[str, int] = {}
        for key, who in asking.items():
            charged = load_charge(key, who)
            self._loading[charged] = self._loading.get(charged, 0) + 1

    def take(self, key: AdapterKey, tenant: str) -> bool:
        """Whether ``tenant`` asking for ``key`` now stays within its quota (then counted)."""
        if key in self._counted or self._in_gpu(key):
            return True
        taken = self._loading.get(tenant, 0)
        limit = self._tenants.max_cold_loads(tenant)
        if limit is not None and taken >= limit:
            return False
        self._counted.add(key)
        self._loading[tenant] = taken + 1
        return True


def class_caps(
    weights: Mapping[str, float], demand: Mapping[str, int], max_num_seqs: int, reserve: int
) -> dict[str, int]:
    """Running-sequence caps of the tenants below the highest priority class among
    ``weights`` (the active tenants): the seats the classes above each one hold or queue for
    (``demand``: running + queued) leave, minus ``reserve``, at least one. None below the top
    class, or ``reserve`` 0: no caps (admission is then work-conserving)."""
    if not reserve or not weights:
        return {}
    top = max(weights.values())
    caps = {}
    for tenant, weight in weights.items():
        if weight < top:
            above = sum(demand.get(t, 0) for t, w in weights.items() if w > weight)
            caps[tenant] = max(1, max_num_seqs - above - reserve)
    return caps


def seat_caps(
    queues: FairQueues, running: Iterable[Request], max_num_seqs: int, reserve: int
) -> dict[str, int]:
    """``class_caps`` of the active tenants now."""
    weights = {t: queues.weight(t) for t in queues.active_tenants()}
    if not reserve or not weights or min(weights.values()) == max(weights.values()):
        return {}  # one priority class: nobody is below the top (``class_caps``)
    demand = Counter(r.tenant for r in running)
    for tenant, queue in queues.queued().items():
        demand[tenant] += len(queue)
    return class_caps(weights, demand, max_num_seqs, reserve)


def admissible(
    queues: FairQueues,
    ready: dict[str, deque[Request]],
    running: Iterable[Request],
    caps: Mapping[str, int],
    max_num_seqs: int,
) -> Iterator[Request]:
    """``ready`` requests (consumed), each time from the backlogged tenant with the least
    virtual time (charges made while admitting count at once), within the class seat caps."""
    seats = Counter(r.tenant for r in running)
    while ready:
        tenant = min(ready, key=lambda t: (queues.vtime(t), t))
        if seats[tenant] >= caps.get(tenant, max_num_seqs):
            del ready[tenant]
            continue
        yield ready[tenant].popleft()
        seats[tenant] += 1  # (a higher class admitted here was counted as queued)
        if not ready[tenant]:
            del ready[tenant]


def lease_room(
    queues: FairQueues, running: Iterable[Request], caps: Mapping[str, int]
) -> dict[str, int]:
    """Capped tenants: how many more queued requests may hold or await a lease."""
    if not caps:
        return {}
    held = Counter(r.tenant for r in running)
    for queue in queues.queued().values():
        for req in queue:
            if req.lease is not None or req.state is RequestState.ADAPTER_WAIT:
                held[req.tenant] += 1
    return {tenant: cap - held[tenant] for tenant, cap in caps.items()}


def lease_window(
    queues: FairQueues, lookahead: int, room: dict[str, int], quota: ColdLoadQuota
) -> list[Request]:
    """WAITING requests that may ask for their adapter's lease now: queued requests in fair
    order until ``lookahead`` distinct adapters are held, awaited or asked for (requests
    sharing an adapter take one place). ``room`` (seats left per capped tenant) is consumed."""
    passed_over: set[str] = set()
    window: set[AdapterKey] = set()
    out: list[Request] = []
    for req in queues.order(passed_over):
        if len(window) >= lookahead:
            break
        key = req.request.adapter_key
        if req.state is not RequestState.WAITING or req.adapter_ready:
            if key is not None:  # holds or awaits its lease (base-model requests need none)
                window.add(key)
            continue
        assert key is not None  # not adapter_ready: it has an adapter
        left = room.get(req.tenant)
        if (left is not None and left <= 0) or not quota.take(key, req.tenant):
            passed_over.add(req.tenant)
            continue
        if left is not None:
            room[req.tenant] = left - 1
        out.append(req)
        window.add(key)
    return out


def hold_followers(
    ready: dict[str, deque[Request]], live: Mapping[str, Request]
) -> dict[str, deque[Request]]:
    """``ready`` minus followers whose ``prefix_leader`` is live and has not yet computed its
    prompt (it samples its first token in the step that does): admitted later, they reuse the
    leader's cached prompt blocks instead of computing them too."""

    def leader_busy(leader_id: str | None) -> bool:
        leader = None if leader_id is None else live.get(leader_id)
        return leader is not None and not leader.output_token_ids

    held = {r.request_id for q in ready.values() for r in q if leader_busy(r.request.prefix_leader)}
    if not held:
        return ready
    kept = {t: deque(r for r in q if r.request_id not in held) for t, q in ready.items()}
    return {t: q for t, q in kept.items() if q}
