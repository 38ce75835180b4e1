"""`loraplex bench plan-check`: run order, judging, the exported traces the planner reads, the
real-run loop (with a stand-in for the real server) and the command line's checks."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from loraplex.bench.sim.plan_check import (
    TIMEOUT_S,
    Deployment,
    PlanCheckConfig,
    TraceSet,
    export_traces,
    run_order,
    run_plan_check,
)
from loraplex.cli import app
from loraplex.plan.objectives import missed, parse_objectives
from loraplex.sim.call import read_trace

ASSETS = Path(__file__).resolve().parents[2] / ".loraplex-assets"
SLO = "ttft_p99<=2000ms,completed_ratio>=0.99"


def _flat(output: str) -> str:
    return " ".join(re.sub("[│╭╮╰╯─]", " ", output).split())


def test_runs_alternate_their_order_between_repeats() -> None:
    assert run_order(2, 3) == [(0, 0), (0, 1), (1, 1), (1, 0), (2, 0), (2, 1)]
    assert run_order(4, 2)[3:5] == [(0, 3), (1, 3)]


def test_a_run_is_judged_by_the_planners_objectives() -> None:
    objectives = parse_objectives(SLO)
    good = {"ttft_ms": {"p50": 30.0, "p99": 120.0}, "completed_ratio": 1.0}
    assert missed(objectives, good) == []
    bad = {"ttft_ms": {"p50": 30.0, "p99": 60000.0}, "completed_ratio": 0.95}
    assert missed(objectives, bad) == [
        "ttft_p99=60000 (wants ttft_p99<=2000ms)",
        "completed_ratio=0.95 (wants completed_ratio>=0.99)",
    ]
    undefined = {"ttft_ms": {"p50": None, "p99": None}, "completed_ratio": None}
    assert len(missed(objectives, undefined)) == 2


def test_the_exported_traces_are_what_the_planner_reads(demo_assets, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    trace_set = TraceSet(("zipf-longtail", "uniform"), trace_requests=20, rate=4.0)
    out = export_traces(trace_set, demo_assets.base_model_dir, tmp_path)
    assert out["bytes_per_rank"] > 0
    for workload in trace_set.workloads():
        path = Path(out["traces"][workload.name]["path"])
        records = read_trace(path)
        assert len(records) == len(workload.requests) == out["traces"][workload.name]["requests"]
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert all(r["size_bytes"] > 0 and r["rank"] <= 64 for r in rows)


def _fake_single(calls: list[tuple[str, int, int]]) -> Any:
    def single(registry, workload, settings, drive, root):  # type: ignore[no-untyped-def]
        calls.append((workload.name, settings.max_loras, settings.cpu_adapter_bytes))
        assert drive.request_timeout_s == TIMEOUT_S == settings.request_timeout_s
        assert settings.options().queue_deadline_s == TIMEOUT_S / 2
        small = settings.cpu_adapter_bytes < 32 << 20
        return {
            "requests": 10,
            "completed": 9 if small else 10,
            "completed_ratio": 0.9 if small else 1.0,
            "ttft_ms": {"p50": 30.0, "p90": 50.0, "p99": 60000.0 if small else 90.0},
            "makespan_s": 5.0,
            "throughput_requests_per_s": 2.0,
            "hit_ratio": {"L0": 0.1, "L1": 0.2, "L2": 0.3, "L3": 0.4},
            "l0_loads": 9,
            "refused": {"context_length_exceeded": 1} if small else {},
        }

    return single


def test_each_deployment_runs_on_each_trace_in_abba_order(demo_assets) -> None:  # type: ignore[no-untyped-def]
    config = PlanCheckConfig(
        TraceSet(("zipf-longtail",), trace_requests=4, rate=4.0, num_adapters=4),
        (Deployment(2, 32 << 20), Deployment(2, 16 << 20)),
        tuple(o.text() for o in parse_objectives(SLO)),
        repeats=2,
        asset_dir=ASSETS,
    )
    calls: list[tuple[str, int, int]] = []
    objectives = parse_objectives(SLO)
    result = run_plan_check(config, lambda o: missed(objectives, o), single=_fake_single(calls))
    assert calls == [
        ("zipf-longtail", 2, 32 << 20),
        ("zipf-longtail", 2, 16 << 20),
        ("zipf-longtail", 2, 16 << 20),
        ("zipf-longtail", 2, 32 << 20),
    ]
    cells = result["summary"]["zipf-longtail"]
    assert cells["slots=2 cpu=32MiB"]["met"] == 2 and cells["slots=2 cpu=32MiB"]["runs"] == 2
    assert cells["slots=2 cpu=16MiB"]["met"] == 0
    assert cells["slots=2 cpu=16MiB"]["ttft_p99_ms"] == [60000.0, 60000.0]
    assert result["config"]["slo"] == ["ttft_p99<=2000ms", "completed_ratio>=0.99"]
    first = result["runs"][0]
    assert first["machine_s_per_correct_request"] == 0.5 and first["violations"] == []
    assert first["refused"] == {} and result["runs"][1]["refused"] == {"context_length_exceeded": 1}
    assert first["load_1m_before"] is not None
    json.dumps(result, allow_nan=False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--configs", "2:16MiB"], "--configs and --slo are required"),
        (["--slo", SLO], "--configs and --slo are required"),
        (["--configs", "2", "--slo", SLO], "no SLOTS:BYTES pair"),
        (["--configs", "x:16MiB", "--slo", SLO], "no SLOTS:BYTES pair"),
        (["--configs", "2:lots", "--slo", SLO], "no size"),
        (["--configs", "0:16MiB", "--slo", SLO], "invalid"),
        (["--configs", "2:16MiB,2:16MiB", "--slo", SLO], "distinct"),
        (["--configs", "2:16MiB", "--slo", "ttft_p99<2s"], "malformed"),
        (["--configs", "2:16MiB", "--slo", SLO, "--traces", "nope"], "nope"),
        (["--configs", "2:16MiB", "--slo", SLO, "--repeats", "0"], "repeats"),
        (["--configs", "2:16MiB", "--slo", SLO, "--rate", "0"], "rate"),
        (["--write-traces", "d", "--configs", "2:16MiB"], "takes no --configs"),
        (["--write-traces", "d", "--repeats", "3"], "takes no --configs, --slo or --repeats"),
    ],
)
def test_plan_check_options_are_checked(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["bench", "plan-check", "--json", *args])
    assert result.exit_code == 2, result.output
    assert message in _flat(result.output)


def test_write_traces_writes_and_runs_nothing(tmp_path: Path) -> None:
    argv = ["bench", "plan-check", "--write-traces", str(tmp_path), "--traces", "zipf-longtail",
            "--trace-requests", "8", "--rate", "4", "--num-adapters", "4",
            "--asset-dir", str(ASSETS)]  # fmt: skip
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    line = json.loads(result.output.strip().splitlines()[-1])
    assert set(line["traces"]) == {"zipf-longtail"} and line["bytes_per_rank"] > 0
    assert read_trace(tmp_path / "zipf-longtail.jsonl")
