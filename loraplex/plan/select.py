"""The planner's sweep and choice: simulate every candidate, price what met the objectives, pick
the cheapest per correct request, and say why the runner-up lost.

``simulate`` is passed in (a function of a ``Candidate``, returning the simulator's result
metrics for the planned trace): the command line binds it to the simulator (``sim/call.py``),
the tests to a deterministic function of their own. The metrics used: ``hit_ratio``,
``ttft_ms``, ``completed_ratio``, ``throughput_requests_per_s`` (the objectives), ``completed``
(requests that completed) and ``makespan_s`` (simulated seconds from the first arrival to the
last end: the time the machines are paid for).

A correct request here is a completed one: the simulator serves the revision it was asked for by
construction and does not model output quality, so completion is the only check it can fail
(besides the objectives, which apply to the whole run).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from loraplex.plan.objectives import Objective, missed
from loraplex.plan.space import Candidate
from loraplex.qualify.cost import MachinePrice, cost_per_correct_request

Simulate = Callable[[Candidate], Mapping[str, Any]]
PLAN_KEYS = ("completed", "makespan_s")


@dataclass(frozen=True)
class Evaluation:
    """One simulated candidate, judged and priced."""

    candidate: Candidate
    outcome: Mapping[str, Any]  # the simulator's outcome
    violations: tuple[str, ...]  # objectives missed, as "metric=value (wants op bound)"
    usd_per_correct: float | None  # None: no request completed (undefined, not free)

    @property
    def feasible(self) -> bool:
        return not self.violations and self.usd_per_correct is not None


@dataclass(frozen=True)
class Plan:
    """The planner's answer."""

    best: Evaluation | None  # the cheapest feasible candidate; None when none was feasible
    runner_up: Evaluation | None  # the next feasible one
    why_runner_up_lost: str | None  # in words
    cheapest_rejected: Evaluation | None  # the cheapest candidate that missed an objective
    evaluations: tuple[Evaluation, ...]  # every candidate, in sweep order


def evaluate(
    candidate: Candidate,
    outcome: Mapping[str, Any],
    objectives: Sequence[Objective],
    price: MachinePrice,
) -> Evaluation:
    missing = [k for k in PLAN_KEYS if k not in outcome]
    if missing:
        raise ValueError(f"the simulator's outcome lacks {missing} (planner keys {PLAN_KEYS})")
    violations = missed(objectives, outcome)
    cost = cost_per_correct_request(
        price, candidate.replicas, float(outcome["makespan_s"]), int(outcome["completed"])
    )
    return Evaluation(candidate, outcome, tuple(violations), cost)


def _rank(evaluation: Evaluation) -> tuple[float, tuple[int, ...]]:
    cost = evaluation.usd_per_correct
    return (float("inf") if cost is None else cost, evaluation.candidate.footprint())


def _ordered(feasible: Sequence[Evaluation], tolerance: float) -> list[Evaluation]:
    """Cheapest first (ties: the smaller footprint); with ``tolerance`` above 0, every candidate
    within that fraction of the cheapest cost counts as tied with it and goes first, smallest
    footprint first."""
    by_cost = sorted(feasible, key=_rank)
    if not by_cost or tolerance == 0:
        return by_cost
    cheapest = by_cost[0].usd_per_correct
    assert cheapest is not None  # feasible candidates have a cost
    bound = cheapest * (1 + tolerance)
    near = [e for e in by_cost if e.usd_per_correct is not None and e.usd_per_correct <= bound]
    near.sort(key=lambda e: (e.candidate.footprint(), e.usd_per_correct))
    taken = {id(e) for e in near}
    return near + [e for e in by_cost if id(e) not in taken]


def choose(evaluations: Iterable[Evaluation], cost_tolerance: float = 0.0) -> Plan:
    """The cheapest feasible candidate (ties: the smaller footprint), the runner-up, and the
    cheapest candidate the objectives rejected. ``cost_tolerance`` (a fraction, >= 0): costs
    within it of the cheapest are ties, so the smallest such footprint wins (a simulated
    makespan a few milliseconds shorter is no reason to hold more slots or memory)."""
    if not (math.isfinite(cost_tolerance) and cost_tolerance >= 0):
        raise ValueError(f"cost_tolerance {cost_tolerance!r} is invalid; expected a fraction >= 0")
    every = tuple(evaluations)
    feasible = _ordered([e for e in every if e.feasible], cost_tolerance)
    rejected = sorted((e for e in every if not e.feasible), key=_rank)
    best = feasible[0] if feasible else None
    runner_up = feasible[1] if len(feasible) > 1 else None
    why = None if best is None or runner_up is None else _why_lost(best, runner_up, cost_tolerance)
    return Plan(best, runner_up, why, rejected[0] if rejected else None, every)


def _why_lost(best: Evaluation, other: Evaluation, tolerance: float = 0.0) -> str:
    a, b = best.usd_per_correct, other.usd_per_correct
    if a is not None and b is not None and b > a * (1 + tolerance):
        # NOTE: a gap of simulated milliseconds printed "0.0% more (0.000146 vs 0.000146)":
        # two significant figures of the gap, and costs precise enough to differ
        gap = f"{(b / a - 1) * 100:.2g}%"
        return f"costs {gap} more per correct request ({b:.6g} vs {a:.6g} USD)"
    if a is not None and b is not None and b != a:
        return (
            f"costs within the {tolerance:.1%} cost tolerance ({b / a - 1:+.4%} per correct "
            f"request) and holds more resources ({other.candidate.label()} vs "
            f"{best.candidate.label()})"
        )
    if other.candidate.footprint() == best.candidate.footprint():
        # NOTE: two policies on the same resources tied, and this said the runner-up "holds more
        # resources": the sweep's order (--eviction, --routing as given) chose, nothing else
        return (
            "costs the same per correct request on the same resources; the earlier in the "
            f"sweep's order (--eviction, --routing as given) is kept ({other.candidate.label()} "
            f"vs {best.candidate.label()})"
        )
    return (
        "costs the same per correct request and holds more resources "
        f"({other.candidate.label()} vs {best.candidate.label()})"
    )


def plan(
    candidates: Iterable[Candidate],
    simulate: Simulate,
    objectives: Sequence[Objective],
    price: MachinePrice,
    cost_tolerance: float = 0.0,
) -> Plan:
    """Simulates every candidate once, in order, and chooses (``choose``)."""
    evaluations = [evaluate(c, simulate(c), objectives, price) for c in candidates]
    return choose(evaluations, cost_tolerance)


def plan_record(result: Plan) -> dict[str, Any]:
    """The plan as JSON values."""

    def one(e: Evaluation | None) -> dict[str, Any] | None:
        if e is None:
            return None
        return {
            "config": asdict(e.candidate) | {"label": e.candidate.label()},
            "usd_per_correct_request": e.usd_per_correct,
            "violations": list(e.violations),
            "ttft_ms": dict(e.outcome["ttft_ms"]),
            "completed_ratio": e.outcome.get("completed_ratio"),
        }

    return {
        "best": one(result.best),
        "runner_up": one(result.runner_up),
        "why_runner_up_lost": result.why_runner_up_lost,
        "cheapest_rejected": one(result.cheapest_rejected),
        "candidates": len(result.evaluations),
        "feasible": sum(e.feasible for e in result.evaluations),
        "swept": [
            {
                "label": e.candidate.label(),
                "usd_per_correct_request": e.usd_per_correct,
                "violations": list(e.violations),
            }
            for e in result.evaluations
        ],
    }
