"""``loraplex bench release``: the checks on hand-made records, and one small real run.

The real run (3 cycles: good, live-fail, good; short phases) goes through a real server
subprocess; its assertions are on what the answers and releases were, never on timings.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from loraplex.bench.release.bench import ReleaseBenchConfig, demo_lineages, run_release_bench
from loraplex.bench.release.check import (
    BASELINE,
    RELEASING,
    Answer,
    CycleOutcome,
    release_metrics,
    wrong_revision,
)
from loraplex.bench.release.cycles import CycleSettings
from loraplex.bench.release.load import LoadConfig
from loraplex.bench.release.plan import CycleKind, choose_sources, cycle_kind, plan_cycles
from loraplex.cli import app
from loraplex.demo.manifest import DemoAssets

REF = "acme/support@r1"
TRUTH = {REF: " one.", "acme/support@r2": " two.", "acme/support@c01": " two."}


def _answer(**changes: Any) -> Answer:
    base = Answer(1.0, "A1", BASELINE, "acme", "support", "acme-u01", 200, 0.01, REF, REF,
                  " one.", "cmpl-1", None)  # fmt: skip
    return dataclasses.replace(base, **changes)


def _outcome(**changes: Any) -> CycleOutcome:
    base = CycleOutcome(0, "acme/support", "acme/support@c01", "good", "r2", "r2", "promoted",
                        None, 1.0, 0, None)  # fmt: skip
    return dataclasses.replace(base, **changes)


def test_wrong_revision_is_judged_on_the_reported_revision() -> None:
    assert not wrong_revision(_answer(), TRUTH)
    assert wrong_revision(_answer(text=" two."), TRUTH)  # r2's text reported as r1
    assert wrong_revision(_answer(header_revision="acme/support@r2"), TRUTH)  # header disagrees
    assert wrong_revision(_answer(revision="acme/support@zz", header_revision="acme/support@zz"),
                          TRUTH)  # fmt: skip
    assert wrong_revision(_answer(revision=None, header_revision=None), TRUTH)
    assert not wrong_revision(_answer(status=503, text=""), TRUTH)  # a failure, counted apart


def test_metrics_count_failures_at_the_timeout_and_keep_undefined_ratios_null() -> None:
    answers = [_answer(ttft_s=0.1 * i) for i in range(1, 11)]
    answers += [_answer(phase_kind=RELEASING, ttft_s=0.5), _answer(phase_kind=RELEASING,
                status=0, ttft_s=None, error="timeout", text="")]  # fmt: skip
    metrics = release_metrics(answers, [_outcome()], TRUTH, timeout_s=30.0)
    phases: Any = metrics["phases"]
    assert phases[RELEASING]["ttft_p99_ms"] == 30_000.0  # the timed-out request
    assert phases[RELEASING]["completed_ratio"] == 0.5
    assert phases[BASELINE]["ttft_p99_ms"] == 1000.0
    assert metrics["release_p99_ttft_ratio"] == 30.0
    assert metrics["failed_requests"] == 1
    assert metrics["good_releases_promoted"] == 1 and metrics["bad_releases_promoted"] == 0
    no_release = release_metrics(answers[:10], [], TRUTH, timeout_s=30.0)
    assert no_release["release_p99_ttft_ratio"] is None  # undefined: null, never 0
    assert no_release["rollback_to_first_old_answer_ms"] is None


def test_bad_outcomes_and_probe_failed_answers_are_counted() -> None:
    outcomes = [
        _outcome(kind="live_fail", state="promoted"),
        _outcome(
            index=1,
            candidate="acme/support@c02",
            kind="probe_fail",
            state="rolled_back",
            rollback_to_old_ms=None,
        ),
        _outcome(index=2, kind="live_fail", state="rolled_back", rollback_to_old_ms=120.0),
    ]
    leaked = _answer(revision="acme/support@c02", header_revision="acme/support@c02", text=" two.")
    metrics = release_metrics([_answer(), leaked], outcomes, {**TRUTH, "acme/support@c02": " two."},
                              timeout_s=30.0)  # fmt: skip
    assert metrics["bad_releases_promoted"] == 1
    assert metrics["bad_releases_rolled_back"] == 2
    assert metrics["probe_failed_candidate_answers"] == 1
    assert metrics["rollback_to_first_old_answer_ms"] == 120.0


def test_plan_has_a_third_bad_and_candidates_answer_unlike_stable(demo_assets: DemoAssets) -> None:
    lineages = demo_lineages(demo_assets)
    assert {x.adapter for x in lineages} == {"acme/support", "globex/search", "initech/review"}
    specs = plan_cycles(20, lineages)
    kinds = [spec.kind for spec in specs]
    assert kinds.count(CycleKind.LIVE_FAIL) + kinds.count(CycleKind.PROBE_FAIL) == 7
    assert kinds.count(CycleKind.PROBE_FAIL) == 3 and cycle_kind(1) is CycleKind.LIVE_FAIL
    assert len({spec.label for spec in specs}) == 20
    for spec in specs:
        texts = spec.lineage.continuations
        for stable in texts:
            sources = choose_sources(spec, stable)
            assert texts[sources.files_from] != texts[stable]
            probe_matches = texts[sources.probe_from] == texts[sources.files_from]
            assert probe_matches is (spec.kind is not CycleKind.PROBE_FAIL)


def test_cli_refuses_a_bad_value_naming_it() -> None:
    result = CliRunner().invoke(app, ["bench", "release", "--cycles", "0", "--report-dir", ""])
    assert result.exit_code != 0
    assert "cycles" in result.output


@pytest.fixture(scope="module")
def small_run(demo_assets: DemoAssets) -> dict[str, Any]:
    config = ReleaseBenchConfig(
        cycles=3,
        baseline_s=1.0,  # each of the two A phases: about 10 baseline requests at 10/s
        warmup_s=1.0,
        # NOTE: release ids are random, so which users land in a canary is too. The live-fail
        # cycle needs two canary users (the worst rater is left out of each judgement): with 8
        # users at a 30 % share that failed about one run in four; with 32, about 1 in 6,000
        # (at the 50 % share below, fewer still).
        load=LoadConfig(rate=10.0, users_per_tenant=32, request_timeout_s=30.0),
        # Two steps still, at larger shares: a step ends once the candidate has min_requests
        # (besides its top callers), and the third released adapter gets about a tenth of the
        # traffic; at (0.3, 0.6) and 2 s its cycle alone took 42 s of a 90 s run, at (0.5, 0.9)
        # and 1 s 15 s of 38 s.
        cycle=CycleSettings(ladder=(0.5, 0.9), dwell_s=1.0, min_requests=3),
        asset_dir=demo_assets.root.parent,
    )
    return run_release_bench(config)


def test_small_run_releases_and_checks_real_answers(small_run: dict[str, Any]) -> None:
    metrics = small_run["metrics"]
    json.dumps({k: small_run[k] for k in ("name", "config", "seed", "metrics")})  # JSON-ready
    cycles = metrics["cycles"]
    assert [c["kind"] for c in cycles] == ["good", "live_fail", "good"]
    assert [c["state"] for c in cycles] == ["promoted", "rolled_back", "promoted"], cycles
    assert metrics["good_releases_promoted"] == 2 and metrics["bad_releases_promoted"] == 0
    assert metrics["wrong_revision_answers"] == 0
    assert metrics["failed_requests"] == 0, metrics["statuses"]
    answers: list[Answer] = small_run["answers"]
    # The candidates really answered: some answers report them, with their files' text.
    candidates = {c["candidate"] for c in cycles}
    served = [a for a in answers if a.revision in candidates]
    assert served and all(a.text == small_run["truth"][a.revision] for a in served)
    # A rolled-back live-fail had canary users, so its rollback was timed.
    assert cycles[1]["canary_users"] > 0 and cycles[1]["rollback_to_old_ms"] is not None
    assert metrics["rollback_to_first_old_answer_ms"] == cycles[1]["rollback_to_old_ms"]
    for kind in (BASELINE, RELEASING):
        assert metrics["phases"][kind]["requests"] > 0, kind


def test_small_run_counts_an_injected_wrong_revision_answer(small_run: dict[str, Any]) -> None:
    answers: list[Answer] = small_run["answers"]
    truth: dict[str, str] = small_run["truth"]
    victim = next(a for a in answers if a.ok and a.revision is not None)
    other = next(text for text in truth.values() if text != victim.text)
    forged = dataclasses.replace(victim, text=other)
    outcomes = [CycleOutcome(**c) for c in small_run["metrics"]["cycles"]]
    metrics = release_metrics([*answers, forged], outcomes, truth, timeout_s=30.0)
    assert metrics["wrong_revision_answers"] == 1


def test_report_path_is_written_by_the_cli_only_when_asked(tmp_path: Path) -> None:
    # Validation happens before any server starts: a bad dwell never creates the report.
    args = ["bench", "release", "--dwell-s", "0", "--report-dir", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0 and "dwell_s" in result.output
    assert not (tmp_path / "release-run.md").exists()
