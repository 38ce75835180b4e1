"""``loraplex bench fleet --topology``: its traces (bench modes' generator), its figures
(tokens per second without failures, ratios per repeat pair, null when undefined), the probe
check, the refusals by name, and once a tiny run on a real Ray fleet (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from loraplex.bench.fleet.report import fleet_json_line
from loraplex.bench.fleet.topology import (
    SIDES,
    TOPOLOGY,
    UNMERGED,
    SideRun,
    Timeline,
    TopologyBenchConfig,
    hot_token_share,
    probe_check,
    revisions,
    tokens_per_s,
    topology_metrics,
    topology_table,
    topology_trace,
)
from loraplex.bench.serve.driver import RequestRecord
from loraplex.bench.workloads import TraceRequest
from loraplex.cli import app

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 30.0


def _record(ttft_s: float | None, tokens: int = 10, status: int = 200) -> RequestRecord:
    error = None if status == 200 else "overloaded"
    return RequestRecord(0.0, "modes", "rev00", "L0", status, ttft_s, None, tokens, "r1", error)


def _run(
    side: str,
    ttfts: list[float | None],
    wall_s: float,
    probes: dict[str, str] | None = None,
    trace: str = "skewed80",
) -> SideRun:
    requests = tuple(TraceRequest(0.0, "modes", "rev00", 6, 10) for _ in ttfts)
    records = tuple(_record(t, status=200 if t is not None else 503) for t in ttfts)
    timeline = Timeline([{"t_s": -3.0, "replica": "r0", "merged": "modes/rev00@r1"}], -3.5)
    return SideRun(
        trace, side, requests, records, wall_s, {"merged": 2}, timeline, probes or {"a": "x"}
    )


def test_traces_come_from_bench_modes_generator_at_the_rate() -> None:
    skewed = topology_trace("skewed80", 0, 4.0, 200, 64)
    assert skewed == topology_trace("skewed80", 0, 4.0, 200, 64)  # deterministic in the seed
    share = hot_token_share(skewed)
    assert share is not None and 0.75 <= share <= 0.85
    assert {r.prompt_tokens for r in skewed} == {64}
    assert all(8 <= r.output_tokens <= 24 for r in skewed)
    assert 150 <= len(skewed) <= 250 and skewed[-1].t_s < 200 / 4.0
    uniform = topology_trace("uniform16", 0, 4.0, 200, 64)
    counts = {a.name: sum(r.adapter == a.name for r in uniform) for a in revisions()}
    assert max(counts.values()) - min(counts.values()) <= 1  # the 16 revisions in turn
    assert [a.rank for a in revisions()][:4] == [16, 32, 64, 8]  # bench modes' ranks


def test_tokens_per_second_count_completed_requests_only() -> None:
    requests = [TraceRequest(0.0, "modes", "rev00", 6, 10)] * 2
    records = [_record(0.1, tokens=10), _record(None, tokens=0, status=503)]
    assert tokens_per_s(records, requests, 2.0) == {
        "tokens_per_s": 8.0,
        "output_tokens_per_s": 5.0,
    }
    assert tokens_per_s([], [], 0.0) == {"tokens_per_s": None, "output_tokens_per_s": None}


def test_metrics_pair_the_repeats_and_leave_undefined_ratios_null() -> None:
    runs = [
        _run(UNMERGED, [0.1, 0.2], 4.0),
        _run(TOPOLOGY, [0.1, 0.1], 2.0),
        _run(TOPOLOGY, [0.1, 0.4], 4.0),
        _run(UNMERGED, [0.1, 0.2], 4.0),
    ]
    metrics = topology_metrics(runs, ("skewed80", "uniform16"), TIMEOUT_S)
    skewed = metrics["skewed80"]
    assert skewed["per_repeat"]["tokens_per_s_topology_over_unmerged"] == [2.0, 1.0]
    assert skewed["tokens_per_s_topology_over_unmerged"] == 1.5
    assert skewed["spread"]["tokens_per_s_topology_over_unmerged"] == [1.0, 2.0]
    assert skewed["per_repeat"]["p99_ttft_topology_over_unmerged"] == [0.5, 2.0]
    assert list(skewed["sides"]) == list(SIDES)
    first = skewed["sides"][TOPOLOGY]["repeats"][0]
    assert first["decisions"] == {"merged": 2} and first["merges"][0]["t_s"] == -3.0
    assert first["first_merged_decision_s"] == -3.5
    uniform = metrics["uniform16"]  # no run: null, never 0
    assert uniform["tokens_per_s_topology_over_unmerged"] is None
    assert uniform["sides"] == {}
    # A failed request counts at the timeout in the P99, and nothing in tokens per second.
    failed = topology_metrics(
        [_run(UNMERGED, [0.1, None], 4.0), _run(TOPOLOGY, [0.1, 0.1], 4.0)],
        ("skewed80",),
        TIMEOUT_S,
    )["skewed80"]
    assert failed["sides"][UNMERGED]["ttft_ms"]["p99"] == TIMEOUT_S * 1000
    assert failed["sides"][UNMERGED]["completed_ratio"] == 0.5
    assert failed["tokens_per_s_topology_over_unmerged"] == 2.0


def test_probe_check_names_every_output_that_differs() -> None:
    same = [_run(s, [0.1], 1.0, {"base": "ab", "rev00": "cd"}) for s in SIDES]
    assert probe_check(same) == {"probes": 2, "runs": 2, "identical": 2, "mismatches": []}
    differ = [*same, _run(TOPOLOGY, [0.1], 1.0, {"base": "ab", "rev00": "ce"})]
    check = probe_check(differ)
    assert check["identical"] == 1
    assert [m["probe"] for m in check["mismatches"]] == ["rev00"]
    assert set(check["mismatches"][0]["outputs"].values()) == {"cd", "ce"}


def test_json_line_and_table() -> None:
    runs = [_run(UNMERGED, [0.1], 2.0), _run(TOPOLOGY, [0.1], 1.0)]
    metrics: dict[str, Any] = topology_metrics(runs, ("skewed80",), TIMEOUT_S)
    metrics.update(probes=probe_check(runs), capacity_rps=[5.0], trace_rate=4.5, hot_token_share={})
    metrics["hot_token_share"]["skewed80"] = 0.8
    config = TopologyBenchConfig(traces=("skewed80",)).plain()
    result = {"name": "fleet-topology", "config": config, "seed": 0, "metrics": metrics}
    parsed = json.loads(fleet_json_line(result))
    assert parsed["config"]["sides"] == list(SIDES)
    assert parsed["metrics"]["skewed80"]["tokens_per_s_topology_over_unmerged"] == 2.0
    table = topology_table(result)
    assert "skewed80 (hot token share 0.8)" in table and "probes: 1 of 1 identical" in table


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"replicas": 1}, "replicas"),
        ({"traces": ("zipf-longtail",)}, "traces"),
        ({"traces": ()}, "traces"),
        ({"load": 0.0}, "load"),
        ({"rate": -1.0}, "rate"),
        ({"warmup_requests": -1}, "warmup_requests"),
        ({"repeats": 0}, "repeats"),
    ],
)
def test_config_refuses_bad_values_naming_the_field(changes: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        TopologyBenchConfig(**changes)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--policies", "pow2"], "--policies"),
        (["--quick"], "--quick"),
        (["--hot-load", "2"], "--hot-load"),
        (["--rate", "2", "--load", "0.5"], "--load"),
        (["--traces", "zipf-longtail"], "traces"),
        (["--replicas", "1"], "replicas"),
        (["--threads", "0"], "torch_threads"),
    ],
)
def test_cli_refuses_options_it_would_not_read(args: list[str], named: str) -> None:
    result = CliRunner().invoke(app, ["bench", "fleet", "--topology", "--json", *args])
    assert result.exit_code == 2, result.output
    assert named in result.output


@pytest.mark.slow  # a local Ray cluster and two fleet deployments: about a minute
@pytest.mark.ray  # its own cluster, in the bench's process
def test_tiny_run_on_a_real_fleet(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-c",
        "from loraplex.cli import main; main()",
        *("bench", "fleet", "--topology", "--json", "--traces", "skewed80", "--repeats", "1"),
        *("--trace-requests", "12", "--warmup-requests", "6", "--rate", "4"),
        *("--asset-dir", str(REPO_ROOT / ".loraplex-assets")),
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=400, cwd=tmp_path, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout[-2000:]
    result = json.loads(lines[0])
    assert result["name"] == "fleet-topology"
    metrics = result["metrics"]
    assert metrics["run_order"] == ["skewed80/unmerged", "skewed80/auto+topology"]
    assert metrics["trace_rate"] == 4.0 and metrics["capacity_rps"] == []
    assert metrics["probes"]["mismatches"] == [] and metrics["probes"]["probes"] == 17
    skewed = metrics["skewed80"]
    for side in SIDES:
        (run,) = skewed["sides"][side]["repeats"]
        assert run["requests"] == metrics["trace_requests"]["skewed80"]
        assert run["completed"] > 0 and run["tokens_per_s"] > 0
    unmerged = skewed["sides"][UNMERGED]["repeats"][0]
    assert unmerged["merges"] == [] and "merged" not in unmerged["decisions"]
    topo = skewed["sides"][TOPOLOGY]["repeats"][0]
    # The hot revision's share dedicates a replica at once; the router names it ``merged``.
    assert topo["first_merged_decision_s"] is not None
    assert topo["decisions"].get("merged", 0) > 0
    assert any(m["merged"] == "modes/rev00@r1" for m in topo["merges"])
