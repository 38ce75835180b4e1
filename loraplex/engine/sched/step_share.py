"""Per-step work shares (torch-free): which running sequences of a tenant wait out this step so
that its work in the step stays within ``step_work_ratio`` of the next busiest tenant's.

Seat shares (``seats``) bound how many sequences a tenant holds, not what they cost each step.
A step's time grows with every sequence in it, and a decode over a long context costs far more
than one over a short context: attention reads every cached position. Measured on ``bench
serve``'s ``seat-hog`` (small demo model, 1 torch thread): 16 attacker sequences at contexts
16-496 beside 10 victim decodes at ~75 tokens made every step 29 ms instead of 14 ms, and the
victims' P99 TTFT 2.7x calm, although the attacker held no more seats than the seat rules allow.

Each tenant's work in the coming step is estimated in KV positions: a decode reads its context
and pays a fixed per-row cost (``ROW_COST_POSITIONS``: the weights' matmuls, the LoRA
shrink/expand, sampling); a prompt chunk (a new request's, or a preempted one's recompute)
counts its new tokens plus the row cost. When two or more tenants have work in the step and the
busiest one (per unit of its priority class's weight) holds more seats than its equal share
(``seats.equal_shares``) and does more than ``ratio`` times the next busiest tenant's work, it
runs only as many of its sequences as keep it within that bound, longest-waiting first, and at
least one. The others keep their seats and their KV blocks and run in the next steps: nothing
is recomputed, and a held-back tenant gives seats up first when another tenant is owed one
(``seats.step_seats``), so it does not sit on seats it cannot use. A tenant alone, within its
equal share of seats, or no busier than ``ratio`` allows is never held back: tenants of similar
load do not hold each other back by turns, and a lone tenant uses the whole engine.

What it buys: while a tenant over its seat share is busy, the step every other tenant waits on
costs their own work plus at most ``ratio`` times the largest of theirs, instead of growing with
the busy tenant's whole batch (``seat-hog``: victims' P99 TTFT 1.24x calm instead of 2.7x). What
it costs: that tenant's rate while others are active (its sequences take turns), and fewer rows
per step (less batching) in those steps.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass

from loraplex.engine.config import SchedulerConfig
from loraplex.engine.request import Request, RequestState
from loraplex.engine.sched.fair_order import FairQueues
from loraplex.engine.sched.seats import MIN_SEATS_FOR_HEADROOM, equal_shares

# A decode row's cost besides reading its context, in KV positions read. Measured with the small
# demo model, float32, 1 torch thread, prompts warmed into the prefix cache, decode attention in
# length buckets (kv/buckets.py): 16 rows at context 64 took 10.8-12.2 ms per step and at
# context 400 13.1-18.9 ms, about 0.45 us per extra position per row; one row alone about 5 ms
# and each further row about 0.45 ms, so a row costs about what 1,000 positions cost.
ROW_COST_POSITIONS = 1024


def row_work(context_tokens: int) -> int:
    """One decode row's work: its context read plus the row's fixed cost."""
    return context_tokens + ROW_COST_POSITIONS


def chunk_work(new_tokens: int) -> int:
    """A prompt chunk's work (a new request's first chunk, or a recompute)."""
    return new_tokens + ROW_COST_POSITIONS


@dataclass(frozen=True)
class StepShares:
    """The rule with its settings: who runs less than all of its sequences this step."""

    weight: Callable[[str], float]  # a tenant's priority-class weight
    ratio: float  # the busiest tenant's work at most this many times the next busiest's
    budget: int  # the step's token budget (a prompt chunk is at most this long)

    def work(self, req: Request) -> int:
        """What ``req`` costs in this step: a decode, or its next prompt chunk."""
        remaining = req.num_tokens - req.num_computed_tokens
        if remaining == 1:
            return row_work(req.num_computed_tokens)
        return chunk_work(min(remaining, self.budget))

    def waiting(
        self,
        running: Sequence[Request],
        queued: Mapping[str, int],
        last_run: Mapping[str, int],
        over_share: Container[str],
    ) -> set[str]:
        """The ids of ``running`` that wait this step.

        ``queued``: each tenant's work in the step from requests it may start (tenants running
        or not). ``last_run``: the step each request last ran in (missing: never), so the busiest
        tenant's longest-waiting sequences run first. ``over_share``: the tenants holding more
        seats than their equal share; only such a tenant is held back.
        """
        work: dict[str, int] = dict(queued)
        rows: dict[str, list[Request]] = {}
        for req in running:
            rows.setdefault(req.tenant, []).append(req)
            work[req.tenant] = work.get(req.tenant, 0) + self.work(req)
        ranked = sorted(((w / self.weight(t), t) for t, w in work.items() if w > 0), reverse=True)
        if len(ranked) < 2:
            return set()
        (top, busiest), (second, _) = ranked[0], ranked[1]
        if busiest not in rows or busiest not in over_share or top <= self.ratio * second:
            return set()
        allowed = self.ratio * second * self.weight(busiest) - queued.get(busiest, 0)
        return self._past(rows[busiest], allowed, last_run)

    def _past(
        self, rows: Iterable[Request], allowed: float, last_run: Mapping[str, int]
    ) -> set[str]:
        """Of one tenant's ``rows``, those past ``allowed`` work when taken longest-waiting first
        (then in admission order); the first always runs."""
        order = sorted(enumerate(rows), key=lambda p: (last_run.get(p[1].request_id, -1), p[0]))
        waiting: set[str] = set()
        spent = 0
        for position, (_, req) in enumerate(order):
            cost = self.work(req)
            if position and spent + cost > allowed:
                waiting.add(req.request_id)
                continue
            spent += cost
        return waiting


def step_waits(
    queues: FairQueues,
    running: Sequence[Request],
    ready: Mapping[str, Iterable[Request]],
    config: SchedulerConfig,
    last_run: Mapping[str, int],
) -> set[str]:
    """Running sequences that wait out this step: the busiest tenant's past its share of the
    step's work; none with ``step_work_ratio`` 0 (off), or in an engine of fewer than
    ``MIN_SEATS_FOR_HEADROOM`` seats, where an equal share is a seat or two and holding one more
    than it is no sign of a hog (as for the seat headroom, ``seats``). ``ready``: each tenant's
    requests that may start this step; ``last_run``: the plan each request last ran in."""
    over = over_share(queues, running, ready, config)
    if not over:
        return set()  # only a tenant over its equal share is held back (``StepShares``)
    ratio, budget = config.step_work_ratio, config.max_num_batched_tokens
    seated = [r for r in running if r.state is RequestState.RUNNING]
    queued = Counter[str]()
    # A ready request counts whether or not a seat is free for it now: the tenant held back
    # gives seats up first (``seats.step_seats``), so it runs in this step all the same.
    for tenant, waiting in ready.items():
        first = next(iter(waiting), None)  # what the tenant may start this step at least
        if first is not None:
            queued[tenant] += chunk_work(min(first.num_tokens, budget))
    shares = StepShares(queues.weight, ratio, budget)
    return shares.waiting(seated, queued, last_run, over)


def over_share(
    queues: FairQueues,
    running: Sequence[Request],
    ready: Mapping[str, Iterable[Request]],
    config: SchedulerConfig,
) -> set[str]:
    """The tenants ``step_waits`` may hold back: those running more sequences than their
    equal share, while two or more tenants have work (none while the rule is off)."""
    if not config.step_work_ratio or config.max_num_seqs < MIN_SEATS_FOR_HEADROOM:
        return set()
    held: dict[str, int] = {}
    for req in running:
        held[req.tenant] = held.get(req.tenant, 0) + 1
    if len(held.keys() | ready.keys()) < 2:
        return set()
    equal = equal_shares(queues, config.max_num_seqs)
    return {t for t, n in held.items() if n > equal.get(t, 0)}
