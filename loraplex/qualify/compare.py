"""The three methods side by side per cell: loraplex as measured, and the comparators of
``loraplex.qualify.baselines`` (separate merged deployments, in-context examples on the base
model) priced for the same traffic.

The one module that calls the comparators. A comparator that raises leaves its method without
a result (null costs and ratios, never 0) and the reason in the report.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from loraplex.qualify.baselines import measure_in_context, measure_separate
from loraplex.qualify.baselines.types import BaselineContext, CellTraffic, MethodResult, Probe
from loraplex.qualify.checks import CellVerdict, discriminates, probe_expectation
from loraplex.qualify.cost import cost_per_correct_request
from loraplex.qualify.plan import QualifyPlan
from loraplex.qualify.reference import Ask
from loraplex.qualify.traffic import CellRun

MEASURES: dict[str, Callable[[BaselineContext, CellTraffic], MethodResult]] = {
    "separate": measure_separate,
    "in_context": measure_in_context,
}


def loraplex_result(run: CellRun, verdict: CellVerdict, plan: QualifyPlan) -> MethodResult:
    """The deployment under test, priced: price x machines x the cell's wall time / correct."""
    cost = cost_per_correct_request(plan.price, plan.machines, run.wall_s, verdict.correct_requests)
    terms: dict[str, object] = {
        "price": plan.price.name, "usd_per_hour": plan.price.usd_per_hour,
        "price_source": plan.price.source, "machines": plan.machines, "wall_s": run.wall_s,
        "requests": verdict.traffic_requests, "correct_requests": verdict.correct_requests,
    }  # fmt: skip
    return MethodResult("loraplex", verdict.pass_ratios, cost, plan.machines, run.wall_s, terms)


def cell_traffic(
    run: CellRun, verdict: CellVerdict, plan: QualifyPlan, refs: dict[Ask, str]
) -> CellTraffic:
    """The cell as a comparator sees it: shape, volume, demand per revision (every active
    revision, 0 for one the cell's traffic did not reach: a separate deployment still runs it)
    and the probes with their expectations (registered, or the offline reference), less those
    the bare base model passes as well (an in-context prompt would pass them with no example)
    and those expecting no text at all (a comparator judges a probe by prefix, which "" is of
    every answer)."""
    traffic = [s for s in run.sent if s.kind == "traffic"]
    counts = Counter(dict.fromkeys(run.active_refs, 0))
    counts.update(s.answer.revision or next(iter(s.target.revisions)) for s in traffic)
    wall = max(run.wall_s, 1e-9)
    probes = [
        Probe(ref, s.target.probe_prompt, expected)
        for s in run.sent if s.kind == "probe" for ref in s.target.revisions
        if (expected := probe_expectation(s, refs, ref))  # "": EOS at once, no prefix to test
        and discriminates(s, refs, ref)
    ]  # fmt: skip
    # NOTE: the shape as sent, its prompt fitted to the deployment's context: the cell's own
    # (1,024 tokens for long-prompt) went to a merged server of the same 512-token model, which
    # refused it, and the separate comparator failed the cell.
    shape = replace(run.cell.shape, prompt_tokens=run.prompt_tokens)
    return CellTraffic(
        run.cell.cell_id, shape, verdict.traffic_requests, run.wall_s,
        {ref: n / wall for ref, n in counts.items()}, plan.objectives.ttft_warm_s,
        plan.objectives.tpot_s, probes,
        {ref: d for s in run.sent for ref, d in s.target.revisions.items() if d is not None},
    )  # fmt: skip


def comparators(
    plan: QualifyPlan, ctx: BaselineContext, traffic: CellTraffic
) -> dict[str, MethodResult | dict[str, Any]]:
    """Each method the plan compares against: its result, or why it has none."""
    out: dict[str, MethodResult | dict[str, Any]] = {}
    for method in plan.compare:
        try:
            out[method] = MEASURES[method](ctx, traffic)
        except (OSError, RuntimeError, ValueError, TimeoutError) as exc:
            out[method] = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
    return out


def cost_ratio(mine: MethodResult, other: MethodResult | dict[str, Any]) -> float | None:
    """loraplex's cost per correct request over the other's; None when either is undefined."""
    if not isinstance(other, MethodResult):
        return None
    if mine.cost_per_correct_request is None or not other.cost_per_correct_request:
        return None
    return mine.cost_per_correct_request / other.cost_per_correct_request


def spend_ratio(mine: MethodResult, other: MethodResult | dict[str, Any]) -> float | None:
    """loraplex's machine-hours for the cell's traffic over the other's, whatever either got
    right: the defined comparison where the other answered nothing correctly (its cost per
    correct request is then undefined). The same requests on both sides, so this is also the
    ratio of cost per request sent. None when either side needs no machine time."""
    if not isinstance(other, MethodResult):
        return None
    theirs = other.machines * other.wall_s
    return None if theirs <= 0 else mine.machines * mine.wall_s / theirs


def median_or_none(values: list[float | None]) -> float | None:
    defined = [v for v in values if v is not None]
    return statistics.median(defined) if defined else None
