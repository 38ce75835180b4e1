"""The four checks on hand-made answers: each check fails exactly the answers it should."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from loraplex.qualify.cells import Cell
from loraplex.qualify.checks import judge, reference_asks
from loraplex.qualify.client import Answer
from loraplex.qualify.cost import TOKEN_SHAPES
from loraplex.qualify.hostile import HostileReport
from loraplex.qualify.plan import QualifyPlan
from loraplex.qualify.reference import Ask
from loraplex.qualify.targets import Target
from loraplex.qualify.traffic import CellRun, Sent

FILES = Path("/adapters/a")  # the revision's files (only a dictionary key here)
TARGET = Target("t", "t/a", {"t/a@r1": FILES}, "probe", None, 8)
PLAN = QualifyPlan()
CELL = Cell(1, "all-8", TOKEN_SHAPES["short"], "uniform")
PROMPT = (5, 6, 7)


def _answer(**fields: object) -> Answer:
    base = {"status": 200, "text": "ref", "revision": "t/a@r1", "tier": "L0", "ttft_s": 0.1,
            "tpot_s": 0.01}  # fmt: skip
    return Answer(**{**base, **fields})  # type: ignore[arg-type]


def _run(traffic: list[Answer], probe: Answer, sampled: bool = True, **hostile: object) -> CellRun:
    sent = [Sent("traffic", TARGET, PROMPT, 16, True, sampled, a) for a in traffic]
    sent.append(Sent("probe", TARGET, "probe", 8, False, True, probe))
    return CellRun(CELL, 32, sent, 1.0, HostileReport(**hostile))  # type: ignore[arg-type]


REFS = {
    Ask(FILES, PROMPT, 16, True): "ref",
    Ask(FILES, "probe", 8, False): "probe-ref",
    Ask(None, "probe", 8, False): "base-ref",  # the base model's answer to the probe
}


def test_a_clean_cell_passes_every_check() -> None:
    run = _run([_answer(), _answer()], _answer(text="probe-ref"))
    assert set(reference_asks(run)) == set(REFS)
    verdict = judge(run, REFS, PLAN)
    assert verdict.passed and verdict.reasons == []
    assert verdict.pass_ratios == dict.fromkeys(verdict.pass_ratios, 1.0)
    assert verdict.correct_requests == 2
    assert verdict.quality == {"t/a@r1": {"pass_ratio": 1.0, "reference_score": 1.0}}
    assert verdict.undiscriminating_probes == 0


def test_a_probe_the_base_model_passes_too_is_counted_and_not_handed_to_comparators() -> None:
    """A generated probe whose reference equals the bare base model's answer tells nothing
    apart: counted per cell, and left out of the probes an in-context prompt is judged on."""
    from loraplex.qualify.compare import cell_traffic

    refs = {**REFS, Ask(None, "probe", 8, False): "probe-ref"}
    run = _run([_answer()], _answer(text="probe-ref"))
    verdict = judge(run, refs, PLAN)
    assert verdict.undiscriminating_probes == 1
    assert cell_traffic(run, verdict, PLAN, refs).probes == []
    verdict = judge(run, REFS, PLAN)
    assert [p.expected for p in cell_traffic(run, verdict, PLAN, REFS).probes] == ["probe-ref"]


def test_a_probe_expecting_no_text_passes_loraplex_and_is_not_a_comparator_probe() -> None:
    """An adapter that ends its probe at once (EOS first) expects "": the served answer is held
    to it, but a comparator's prefix test cannot use it (every answer starts with "")."""
    from loraplex.qualify.compare import cell_traffic

    refs = {**REFS, Ask(FILES, "probe", 8, False): ""}
    run = _run([_answer()], _answer(text=""))
    verdict = judge(run, refs, PLAN)
    assert verdict.pass_ratios["quality"] == 1.0 and verdict.undiscriminating_probes == 0
    assert cell_traffic(run, verdict, PLAN, refs).probes == []


def test_wrong_revision_or_text_fails_correct_revision() -> None:
    run = _run([_answer(revision="t/a@r2"), _answer(text="other")], _answer(text="probe-ref"))
    verdict = judge(run, REFS, PLAN)
    assert verdict.pass_ratios["correct_revision"] == 0.0 and not verdict.passed
    assert verdict.correct_requests == 0


def test_a_text_is_only_checked_when_sampled() -> None:
    run = _run([_answer(text="other")], _answer(text="probe-ref"), sampled=False)
    assert judge(run, REFS, PLAN).pass_ratios["correct_revision"] == 1.0


def test_a_failed_probe_fails_quality_of_its_adapter() -> None:
    verdict = judge(_run([_answer()], _answer(text="wrong")), REFS, PLAN)
    assert verdict.pass_ratios["quality"] == 0.0 and verdict.correct_requests == 0
    assert verdict.quality["t/a@r1"] == {"pass_ratio": 0.0, "reference_score": 1.0}


def test_cold_and_warm_answers_meet_their_own_objective() -> None:
    slow_warm = _answer(tier="L0", ttft_s=PLAN.objectives.ttft_warm_s + 1)
    cold_ok = _answer(tier="L3", ttft_s=PLAN.objectives.ttft_warm_s + 1)
    slow_tokens = _answer(tpot_s=PLAN.objectives.tpot_s * 2)
    verdict = judge(_run([slow_warm, cold_ok, slow_tokens], _answer(text="probe-ref")), REFS, PLAN)
    assert verdict.pass_ratios["latency"] == pytest.approx(1 / 3)
    assert len(verdict.ttft_warm_s) == 2 and len(verdict.ttft_cold_s) == 1


def test_a_breach_fails_isolation_of_every_answer() -> None:
    run = _run([_answer()], _answer(text="probe-ref"), breaches=["hostile asked t/a: 200"])
    verdict = judge(run, REFS, PLAN)
    assert verdict.pass_ratios["isolation"] == 0.0 and not verdict.passed
    assert any("isolation breach" in r for r in verdict.reasons)


def test_victim_failures_count_against_isolation_beyond_the_bound() -> None:
    run = _run([_answer(), _answer(status=503, error="busy")], _answer(text="probe-ref"))
    assert judge(run, REFS, PLAN).pass_ratios["isolation"] == 0.5
    tolerant = replace(PLAN, isolation=replace(PLAN.isolation, max_victim_failures=1))
    assert judge(run, REFS, tolerant).pass_ratios["isolation"] == 1.0


def test_unknown_files_leave_the_text_unverified() -> None:
    absent = replace(TARGET, revisions={"t/a@r1": None}, probe_expected={"t/a@r1": "probe-ref"})
    sent = [Sent("traffic", absent, PROMPT, 16, True, True, _answer(text="anything")),
            Sent("probe", absent, "probe", 8, False, True, _answer(text="probe-ref"))]  # fmt: skip
    verdict = judge(CellRun(CELL, 32, sent, 1.0, HostileReport()), {}, PLAN)
    assert verdict.unverified_texts == 1 and verdict.pass_ratios["correct_revision"] == 1.0
    assert verdict.quality["t/a@r1"]["reference_score"] is None


def test_a_canary_probe_is_judged_by_the_revision_that_answered() -> None:
    both = replace(
        TARGET,
        revisions={"t/a@r1": None, "t/a@r2": None},
        probe_expected={"t/a@r1": "one", "t/a@r2": "two"},
    )
    probes = [
        Sent("probe", both, "probe", 8, False, True, _answer(revision="t/a@r2", text="two")),
        Sent("probe", both, "probe", 8, False, True, _answer(revision="t/a@r1", text="two")),
        Sent("probe", both, "probe", 8, False, True, _answer(revision="t/a@r3", text="two")),
    ]
    verdict = judge(CellRun(CELL, 32, probes, 1.0, HostileReport()), {}, PLAN)
    assert verdict.pass_ratios["quality"] == pytest.approx(1 / 3)
    assert verdict.quality["t/a@r2"]["pass_ratio"] == 1.0
    assert verdict.quality["t/a@r1"]["pass_ratio"] == 0.0


def test_a_refused_request_counts_against_availability_not_revision() -> None:
    refused = _answer(status=503, error="engine unresponsive", revision=None, text="")
    run = _run([_answer(), refused], _answer(text="probe-ref"))
    verdict = judge(run, REFS, PLAN)
    assert verdict.pass_ratios["correct_revision"] == 1.0
    assert verdict.answered == 1 and verdict.failures == {"503": 1}
    assert verdict.correct_requests == 1 and verdict.traffic_requests == 2
    assert "availability_ratio 0.5 < 1.0" in verdict.reasons and not verdict.passed


def test_an_error_event_or_timeout_is_a_failure_by_its_error() -> None:
    broken = _answer(error="engine_error", text="")
    late = _answer(status=0, error="timeout", revision=None, text="")
    verdict = judge(_run([broken, late], _answer(text="probe-ref")), REFS, PLAN)
    assert verdict.failures == {"engine_error": 1, "timeout": 1}
    assert verdict.pass_ratios["correct_revision"] is None and verdict.correct_requests == 0


def test_retries_are_counted_per_cell() -> None:
    retried = _answer(retried=[503, 503])
    verdict = judge(_run([retried, _answer()], _answer(text="probe-ref")), REFS, PLAN)
    assert verdict.retries == 2 and verdict.retried_requests == 1 and verdict.passed
