"""Per-tenant seats: how many running sequences (and KV blocks) each tenant may hold now.

The engine's ``max_num_seqs`` seats are split among the active tenants (running or queued) by
weighted max-min fairness over their demand (running + queued sequences; every ``n`` /
``best_of`` sibling is its own engine request, so its own seat): a tenant's
``reserved_running_seqs`` come first, then seats go one at a time to the tenant with the fewest
per unit of weight (its priority class's), never past its demand or its ``max_running_seqs``.
Every seat some tenant can use is handed out, so a lone tenant gets them all (work-conserving).

The share is what a tenant can claim, not a ceiling: seats beyond it go by work (virtual time),
as the fair order admits. A tenant under its share with a request ready is owed a seat when it
is below its reservation or has done no more work than a tenant over its share; then everyone is
capped at their share this step and, with no seat free, the newest sequence of the tenant most
over its share is preempted (its KV is freed and recomputed when it runs again), so a newcomer
waits one step, not for a long generation to end (``plan_seats``).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass

from loraplex.engine.request import Request
from loraplex.engine.sched.admission import seat_caps
from loraplex.engine.sched.fair_order import FairQueues


def fair_seats(
    weights: Mapping[str, float],
    demand: Mapping[str, int],
    reserved: Mapping[str, int],
    maxima: Mapping[str, int],
    total: int,
) -> dict[str, int]:
    """Seats per tenant of ``weights``: reserved seats (up to demand) first, then weighted
    max-min fair, each within ``min(demand, maxima)``, until ``total`` are handed out."""
    limit = {t: min(demand.get(t, 0), maxima.get(t, total)) for t in weights}
    alloc = dict.fromkeys(weights, 0)

    def key(t: str) -> tuple[bool, float, str]:
        return (alloc[t] >= reserved.get(t, 0), alloc[t] / weights[t], t)

    heap = [(key(t), t) for t in weights if limit[t] > 0]
    heapq.heapify(heap)
    for _ in range(total):
        if not heap:
            break
        _, tenant = heapq.heappop(heap)
        alloc[tenant] += 1
        if alloc[tenant] < limit[tenant]:
            heapq.heappush(heap, (key(tenant), tenant))
    return alloc


def seat_shares(
    queues: FairQueues, running: Iterable[Request], max_num_seqs: int
) -> dict[str, int]:
    """``fair_seats`` of the active tenants now, from their ``TenantSettings``."""
    demand = Counter(r.tenant for r in running)
    for tenant, queue in queues.queued().items():
        demand[tenant] += len(queue)
    active = queues.active_tenants()
    settings = {t: queues.tenants.get(t) for t in active}
    reserved = {t: s.reserved_running_seqs for t, s in settings.items()}
    maxima = {t: s.max_running_seqs for t, s in settings.items() if s.max_running_seqs is not None}
    weights = {t: s.weight for t, s in settings.items()}
    return fair_seats(weights, demand, reserved, maxima, max_num_seqs)


@dataclass(frozen=True)
class SeatPlan:
    """This step's seat decisions (``plan_seats``)."""

    caps: dict[str, int]  # seats per tenant this step (empty: nobody is owed one)
    victims: list[Request]  # running sequences to preempt first, newest of each tenant


def plan_seats(
    running: list[Request],
    shares: Mapping[str, int],
    *,
    reserved: Mapping[str, int],
    ready: Mapping[str, int],
    vtime: Callable[[str], float],
    free_seats: int,
) -> SeatPlan:
    """Who is owed a seat now and which sequences give theirs up.

    A tenant is owed seats when it has requests ``ready``, holds fewer than its share, and
    either holds fewer than its ``reserved`` seats or some tenant over its share has done at
    least as much work (virtual time): work-fairness decides who runs more than its share, the
    share only bounds how long a tenant waits for a seat. While anyone is owed a seat, every
    tenant is capped at its share; when the free seats do not cover what is owed, the newest
    sequences of the tenants most over their share are preempted.
    """
    held = Counter(r.tenant for r in running)
    over = {t: held[t] - shares.get(t, 0) for t in held if held[t] > shares.get(t, 0)}

    def below_reserve(t: str) -> bool:
        return held[t] < reserved.get(t, 0)

    def yields_to(u: str, t: str) -> bool:  # ``u`` holds what ``t`` asks for: ``t`` comes first
        return u != t and (below_reserve(t) or vtime(u) >= vtime(t))

    def givers(t: str) -> list[str]:  # tenants over their share that give ``t`` a seat
        return [u for u, n in over.items() if n > 0 and yields_to(u, t)]

    owed = {t: min(n, shares.get(t, 0) - held[t]) for t, n in ready.items()}
    full = [u for u in held if held[u] >= shares.get(u, 0)]  # at or over their share
    owed = {t: n for t, n in owed.items() if n > 0 and any(yields_to(u, t) for u in full)}
    if not owed:
        return SeatPlan({}, [])
    missing = sum(owed.values()) - free_seats
    victims: list[Request] = []
    for tenant in sorted(owed, key=lambda t: (not below_reserve(t), vtime(t), t)):
        for _ in range(owed[tenant]):
            candidates = givers(tenant)
            if missing <= 0 or not candidates:
                break
            giver = max(candidates, key=lambda u: (over[u], u))
            victims.append(_newest(running, giver, victims))
            over[giver] -= 1
            missing -= 1
    return SeatPlan(dict(shares), victims)


def _newest(running: list[Request], tenant: str, taken: list[Request]) -> Request:
    """``tenant``'s most recently admitted running sequence not already ``taken`` (``Request``
    compares by identity)."""
    return next(r for r in reversed(running) if r.tenant == tenant and r not in taken)


def limit_caps(
    queues: FairQueues, running: list[Request], max_num_seqs: int, reserve: int
) -> dict[str, int]:
    """Running sequences each capped tenant may hold at most: its class seat cap
    (``admission.seat_caps``) or its ``max_running_seqs``, whichever is less."""
    caps = seat_caps(queues, running, max_num_seqs, reserve)
    for tenant in queues.active_tenants():
        limit = queues.tenants.get(tenant).max_running_seqs
        if limit is not None:
            caps[tenant] = min(caps.get(tenant, limit), limit)
    return caps


def step_seats(
    queues: FairQueues,
    running: list[Request],
    ready: Mapping[str, deque[Request]],
    max_num_seqs: int,
    reserve: int,
    *,
    held_back: Container[str] = (),
) -> tuple[dict[str, int], list[Request]]:
    """This step's seat caps (``limit_caps``, and every share while a tenant is owed a seat)
    and the running sequences to preempt first; ``ready``: the requests that may run now.
    ``held_back``: the tenant held to its share of this step's work (``step_share``): over its
    share it counts as having done the most work, so it gives a seat up to a tenant owed one
    (its virtual time lags only because it is held back)."""
    caps = limit_caps(queues, running, max_num_seqs, reserve)
    for tenant, cap in headroom_caps(queues, running, max_num_seqs).items():
        caps[tenant] = min(caps.get(tenant, cap), cap)
    if not ready:
        return caps, []
    # A share the limits cut is not owed: preempting for it frees a seat nobody may take.
    fair = seat_shares(queues, running, max_num_seqs)
    shares = {t: min(share, caps.get(t, share)) for t, share in fair.items()}
    plan = plan_seats(
        running,
        shares,
        reserved={t: queues.tenants.get(t).reserved_running_seqs for t in shares},
        ready={t: len(q) for t, q in ready.items()},
        vtime=lambda t: math.inf if t in held_back else queues.vtime(t),
        free_seats=max_num_seqs - len(running),
    )
    for tenant, share in plan.caps.items():
        caps[tenant] = min(caps.get(tenant, share), share)
    return caps, plan.victims


MIN_SEATS_FOR_HEADROOM = 8  # below this an engine is not capped: a kept-free seat is an eighth


def equal_shares(queues: FairQueues, max_num_seqs: int) -> Mapping[str, int]:
    """Each active tenant's equal share of ``max_num_seqs`` by weight, rounded down."""
    return queues.equal_shares(max_num_seqs)


def headroom_caps(queues: FairQueues, running: list[Request], max_num_seqs: int) -> dict[str, int]:
    """Caps that keep seats free for the other active tenants up to their equal shares.

    While two or more tenants are active, a tenant past its equal share (of ``max_num_seqs``
    by weight) and its reservation grows only into free seats beyond what the others of its
    priority class or a lower one may still claim within their own equal shares (an equal share
    less the seats it holds). Without it a
    tenant with a backlog retakes every seat the moment one frees, and each arrival of another
    tenant preempts one of its sequences, to be recomputed (measured on ``bench serve``'s
    ``seat-hog``: 149 preemptions and 19,588 tokens recomputed in 15 s); with a fixed headroom of
    an eighth of the seats, the hog still ran 28 decodes in every step the victims' requests
    waited on (victims' P99 TTFT 7.3x calm, ``docs/benchmarks/serve.md``). A lone tenant is
    never capped (every seat is used), and a tenant's share grows as the others leave.
    """
    active = queues.active_tenants()
    if len(active) < 2 or max_num_seqs < MIN_SEATS_FOR_HEADROOM:
        return {}
    held = Counter(r.tenant for r in running)
    equal = equal_shares(queues, max_num_seqs)
    weights = {t: queues.weight(t) for t in active}  # each read once, not once per pair
    unclaimed = {t: max(0, equal[t] - held[t]) for t in active}
    free = max_num_seqs - len(running)
    caps = {}
    for t in active:
        # NOTE: a higher class is kept seats by the class reserve (``admission.class_caps``).
        weight = weights[t]
        kept = sum(n for u, n in unclaimed.items() if u != t and weights[u] <= weight)
        grow = max(0, free - kept)
        caps[t] = max(equal[t], queues.tenants.get(t).reserved_running_seqs, held[t] + grow)
    return caps
