"""Pricing and the comparators' seam: loraplex's cost terms, the traffic a comparator is given,
and null (never 0) wherever a ratio is undefined."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from test_checks import CELL, PLAN, REFS, _answer, _run

from loraplex.qualify.baselines.pricing import replicas_needed
from loraplex.qualify.baselines.types import BaselineContext, CellTraffic, MethodResult
from loraplex.qualify.checks import judge
from loraplex.qualify.compare import (
    cell_traffic,
    cost_ratio,
    loraplex_result,
    median_or_none,
)
from loraplex.qualify.plan import QualifyPlan
from loraplex.qualify.report import CellReport, build_report


def _priced() -> tuple[MethodResult, object]:
    run = _run([_answer(), _answer(status=503, error="busy")], _answer(text="probe-ref"))
    verdict = judge(run, REFS, PLAN)
    return loraplex_result(run, verdict, PLAN), (run, verdict)


def test_loraplex_is_priced_per_correct_request_with_every_term() -> None:
    mine, _ = _priced()
    price = PLAN.price.usd_per_hour
    assert mine.cost_per_correct_request == price * 1.0 * (1.0 / 3600) / 1
    assert mine.terms["correct_requests"] == 1 and mine.terms["requests"] == 2
    assert mine.terms["price_source"] == PLAN.price.source and mine.terms["machines"] == 1.0


def test_no_correct_request_is_an_undefined_cost_not_zero() -> None:
    run = _run([_answer(status=503, error="busy")], _answer(text="wrong"))
    mine = loraplex_result(run, judge(run, REFS, PLAN), PLAN)
    assert mine.cost_per_correct_request is None
    assert cost_ratio(mine, mine) is None
    assert median_or_none([None, None]) is None and median_or_none([None, 2.0]) == 2.0


def test_a_comparator_gets_the_cell_with_reference_expectations() -> None:
    _, (run, verdict) = _priced()
    traffic = cell_traffic(run, verdict, PLAN, REFS)  # type: ignore[arg-type]
    assert traffic.cell_id == CELL.cell_id and traffic.requests == 2
    assert traffic.demand_per_adapter_rps == {"t/a@r1": 2.0}
    assert [(p.adapter_ref, p.expected) for p in traffic.probes] == [("t/a@r1", "probe-ref")]


def test_a_comparator_gets_the_prompt_length_the_cell_sent() -> None:
    """long-prompt's 1,024 tokens are cut to fit the deployment's context (495 on the demo
    model); the separate comparator was given the uncut shape, and its merged server of the
    same model refused every request (400), so the cell had no separate cost."""
    _, (run, verdict) = _priced()
    cut = replace(run, prompt_tokens=run.cell.shape.prompt_tokens - 7)  # type: ignore[attr-defined]
    traffic = cell_traffic(cut, verdict, PLAN, REFS)  # type: ignore[arg-type]
    assert traffic.shape.prompt_tokens == run.cell.shape.prompt_tokens - 7  # type: ignore[attr-defined]
    assert traffic.shape.output_tokens == run.cell.shape.output_tokens  # type: ignore[attr-defined]


def test_an_active_adapter_without_traffic_still_needs_its_deployment() -> None:
    _, (run, verdict) = _priced()
    active = replace(run, active_refs=("t/a@r1", "t/b@r1", "t/c@r1"))  # type: ignore[attr-defined]
    traffic = cell_traffic(active, verdict, PLAN, REFS)  # type: ignore[arg-type]
    assert traffic.demand_per_adapter_rps == {"t/a@r1": 2.0, "t/b@r1": 0.0, "t/c@r1": 0.0}
    replicas = replicas_needed(traffic.demand_per_adapter_rps, 10.0, scale_to_zero=False)
    assert replicas == {"t/a@r1": 1, "t/b@r1": 1, "t/c@r1": 1}


def test_a_comparator_without_a_result_leaves_its_ratios_null() -> None:
    mine, (run, verdict) = _priced()
    unavailable = {"status": "failed", "reason": "RuntimeError: the server did not start"}
    ratios = {"correct_revision": 1.0, "quality": 1.0, "latency": 1.0, "isolation": 1.0}
    separate = MethodResult("separate", ratios, mine.cost_per_correct_request * 4, 3.0,
                            1.0, {})  # type: ignore[operator]  # fmt: skip
    others = {"separate": separate, "in_context": unavailable}
    report = build_report(
        QualifyPlan(),
        "http://x",
        [CellReport(run, verdict, mine, others)],
        [],
        1.0,  # type: ignore[arg-type]
    )
    (cell,) = report.payload["cells"]
    assert cell["methods"]["in_context"] == unavailable
    assert cell["cost_per_correct_request_over_in_context"] is None
    assert cell["cost_per_correct_request_over_separate"] == 0.25
    assert report.payload["headline"]["cost_per_correct_request_over_in_context"] is None
    assert report.payload["headline"]["cost_per_correct_request_over_separate_at_256"] is None
    assert report.exit_code() == 1 and report.payload["failed_cells"] == [CELL.cell_id]


def test_a_comparator_that_raises_is_reported_failed_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loraplex.qualify import compare

    def broken(ctx: BaselineContext, cell: CellTraffic) -> MethodResult:
        raise RuntimeError("the dedicated server did not start")

    seen: list[str] = []

    def fine(ctx: BaselineContext, cell: CellTraffic) -> MethodResult:
        seen.append(cell.cell_id)
        ratios = {"correct_revision": None, "quality": 0.0, "latency": 1.0, "isolation": None}
        return MethodResult("in_context", ratios, None, 1.0, 1.0, {})

    monkeypatch.setitem(compare.MEASURES, "separate", broken)
    monkeypatch.setitem(compare.MEASURES, "in_context", fine)
    _, (run, verdict) = _priced()
    traffic = cell_traffic(run, verdict, PLAN, REFS)  # type: ignore[arg-type]
    ctx = BaselineContext(tmp_path, "small", PLAN.price, tmp_path, quick=True)
    out = compare.comparators(PLAN, ctx, traffic)
    assert out["separate"] == {
        "status": "failed",
        "reason": "RuntimeError: the dedicated server did not start",
    }
    assert isinstance(out["in_context"], MethodResult) and seen == [CELL.cell_id]


def test_in_context_with_no_correct_answer_still_gets_a_spend_ratio() -> None:
    """Quality 0 leaves in-context's cost per correct request undefined (null ratio); the
    machine-hours for the same requests are still compared, and reported beside quality."""
    mine, (run, verdict) = _priced()
    ratios = {"correct_revision": None, "quality": 0.0, "latency": 1.0, "isolation": None}
    in_context = MethodResult("in_context", ratios, None, 4.0, 1.0, {})
    report = build_report(
        QualifyPlan(), "http://x", [CellReport(run, verdict, mine, {"in_context": in_context})],
        [], 1.0,
    )  # fmt: skip
    (cell,) = report.payload["cells"]
    assert cell["cost_per_correct_request_over_in_context"] is None
    assert cell["cost_per_request_over_in_context"] == 0.25  # 1 machine x 1 s over 4 x 1 s
    headline = report.payload["headline"]
    assert headline["cost_per_request_over_in_context"] == 0.25
    assert headline["quality_ratio_in_context"] == 0.0
