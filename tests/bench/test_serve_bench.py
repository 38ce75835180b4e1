"""``loraplex bench serve`` in a tiny configuration: real server subprocesses, real HTTP.

Checks the JSON line's shape, that every request completed or failed with an expected status,
and that the report and plots are written; never timings.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from loraplex.bench.serve import bench as bench_module
from loraplex.bench.serve.config import SCENARIOS, ServeBenchConfig
from loraplex.bench.serve.driver import TIERS, ResidencyView
from loraplex.bench.serve.summary import hit_ratios
from loraplex.bench.serve.throughput import ThroughputConfig, measure_throughput
from loraplex.cli import app
from loraplex.demo.assets import DemoAssets

# Headline ratios the tiny run always has data for (storm_warm_p99_ttft_ratio may not).
MEASURED = ("http_over_offline_throughput", "hot_burst_p99_ttft_lru_over_cost_aware")
RUNS = ("hot-burst@9/lru", "hot-burst@9/lru_priority", "hot-burst@9/cost_aware",
        "hot-burst@9/admit_gdsf",
        "zipf-longtail/lru", "zipf-longtail/cost_aware",
        "cold-storm/storm", "cold-storm/no-storm")  # fmt: skip
# 200: completed; 429 / 503: shed by the queue (Retry-After); 0 only for a client-side timeout.
EXPECTED_STATUSES = {"200", "429", "503"}


CAPACITY_REQUESTS = 16  # per capacity round (128 by default): enough to saturate the server
# The ThroughputConfig each measure_throughput call of the module's run received.
MEASURED_WITH: list[ThroughputConfig] = []


def _recording_measure(*args: Any, **kwargs: Any) -> Any:
    MEASURED_WITH.append(args[3])
    return measure_throughput(*args, **kwargs)


@pytest.fixture(scope="module")
def bench(
    demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, Any], Path]:
    report = tmp_path_factory.mktemp("report")
    args = ["bench", "serve", "--json", "--duration-s", "2", "--rate", "3", "--num-adapters", "4",
            "--throughput-rounds", "1", "--throughput-requests", "8", "--report-dir", str(report),
            "--capacity-requests", str(CAPACITY_REQUESTS),
            "--hot-burst-slots", "9", "--trace-repeats", "1",
            "--asset-dir", str(demo_assets.root.parent)]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bench_module, "measure_throughput", _recording_measure)
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1
    return json.loads(lines[0]), report


def test_json_line_shape(bench: tuple[dict[str, Any], Path]) -> None:
    line, _ = bench
    assert set(line) == {"name", "config", "seed", "metrics"}
    assert line["name"] == "serve" and line["seed"] == 0
    assert tuple(line["config"]["scenarios"]) == SCENARIOS
    machine = line["config"]["machine"]  # the harness's machine record (issue 26)
    assert machine["cores"] >= 1 and set(machine) == {"cpu", "cores", "load_1m", "python"}
    metrics = line["metrics"]
    for name in MEASURED:  # undefined ratios are null: a run that measured nothing fails here
        assert isinstance(metrics[name], float) and math.isfinite(metrics[name]), name
        assert metrics[name] > 0, name
    # The tiny trace may hold no steady request whose adapter was warm on arrival: then the
    # ratio is null, never 0.0 (a "perfect" value for a lower-is-better ratio).
    sides = [metrics[f"storm_warm_p99_ttft_ms_{s}"] for s in ("storm", "no_storm")]
    if None in sides:
        assert metrics["storm_warm_p99_ttft_ratio"] is None
    else:
        assert metrics["storm_warm_p99_ttft_ratio"] == round(sides[0] / sides[1], 3)
    assert metrics["http_over_offline_throughput"] > 0
    assert len(metrics["capacity_rps"]) == 2 and all(v > 0 for v in metrics["capacity_rps"])
    assert line["config"]["capacity_requests"] == CAPACITY_REQUESTS
    assert [c.capacity_requests for c in MEASURED_WITH] == [CAPACITY_REQUESTS]
    assert metrics["trace_rate"] == 3.0 and metrics["trace_duration_s"] == 2.0  # given, not derived
    assert set(metrics["runs"]) == set(RUNS)
    # The price beside the gain, and completed ratios beside both (in this order).
    keys = list(metrics)
    gain = keys.index("hot_burst_p99_ttft_lru_priority_over_admit_gdsf")
    assert keys[gain + 1] == "hot_burst_hot_completed_ratio_lru"
    price = metrics["hot_burst_batch_p50_ttft_cost_aware_over_lru"]
    sides = [metrics[f"hot_burst_batch_p50_ttft_ms_{p}"] for p in ("cost_aware", "lru")]
    assert price == (None if None in sides else round(sides[0] / sides[1], 3))
    assert set(metrics["hot_burst_sweep"]) == {"9"} and metrics["hot_burst_slots"] == 9
    assert metrics["throughput_completed_ratio_http"] == 1.0
    assert metrics["throughput_completed_ratio_offline"] == 1.0
    assert metrics["page_cache_dropped_per_run"] is True


def test_every_request_completed_or_failed_as_expected(bench: tuple[dict[str, Any], Path]) -> None:
    runs = bench[0]["metrics"]["runs"]
    for name, run in runs.items():
        assert run["requests"] > 0, name
        assert run["completed"] > 0, (name, run["statuses"])  # an all-503 run is a failure
        assert run["ttft_ms"]["p50"] is not None and run["ttft_ms"]["p50"] > 0, name
        assert sum(run["statuses"].values()) == run["requests"], name
        assert set(run["statuses"]) <= EXPECTED_STATUSES, (name, run["statuses"])
        assert run["completed"] == run["statuses"].get("200", 0), name
        assert sum(run["tier_at_arrival"].values()) == run["requests"], name
        ratios = run["hit_ratio"]
        assert set(ratios) == set(TIERS), name
        assert all(v is not None for v in ratios.values()), (name, ratios)
        assert abs(sum(ratios.values()) - 1) < 1e-3, name
    assert bench[0]["metrics"]["throughput_http_failures"] == 0


def test_runs_split_by_tenant_and_tier(bench: tuple[dict[str, Any], Path]) -> None:
    runs = bench[0]["metrics"]["runs"]
    assert set(runs["hot-burst@9/lru"]["by_tenant"]) == {"prio", "batch"}
    # The tiny trace may hold no storm request at all; the calm run never has one.
    assert runs["cold-storm/no-storm"]["requests"] <= runs["cold-storm/storm"]["requests"]
    assert "storm" not in runs["cold-storm/no-storm"]["by_tenant"]
    for run in runs.values():
        assert set(run["by_tier"]) <= set(TIERS)
        # Every request counts in the TTFT percentiles (a failed one at the timeout).
        assert sum(group["ttft_ms"]["n"] for group in run["by_tier"].values()) == run["requests"]
        assert sum(group["completed"] for group in run["by_tier"].values()) == run["completed"]


def test_report_and_plots_written(bench: tuple[dict[str, Any], Path]) -> None:
    line, report = bench
    markdown = (report / "serve-run.md").read_text(encoding="utf-8")
    assert json.dumps(line) in markdown
    for png in ("serve-ttft-cdf.png", "serve-hit-ratio.png", "serve-ttft-cdf-tenant.png"):
        assert (report / png).read_bytes().startswith(b"\x89PNG")
    assert "![hot-burst TTFT CDF per tenant](serve-ttft-cdf-tenant.png)" in markdown
    # The hot-burst point's figures per repeat, as [median, min, max] (one repeat here).
    spread = line["metrics"]["hot_burst_repeats"]["9"]
    assert (
        spread["hot_burst_p99_ttft_lru_over_cost_aware"]
        == [line["metrics"]["hot_burst_p99_ttft_lru_over_cost_aware"]] * 3
    )


def test_residency_view_keeps_the_fastest_ready_tier() -> None:
    view = ResidencyView()
    entries = [
        {"model": "t/a@r1", "tier": "L2", "ready": True},
        {"model": "t/a@r1", "tier": "L0", "ready": True},
        {"model": "t/b@r1", "tier": "L0", "ready": False},
        {"model": "t/b@r1", "tier": "L1", "ready": True},
    ]
    view.update({"entries": entries, "stats": {"hits": {"L0": 3}, "misses": 1}}, 0.5)
    assert view.tier_of("t", "a", "r1") == "L0"
    assert view.tier_of("t", "b", "r1") == "L1"
    assert view.tier_of("t", "c", "r1") == "L3"
    assert view.hit_series == [(0.5, {"L0": 3, "L3": 1})]


def test_hit_ratios_and_config_validation() -> None:
    ratios = hit_ratios({"hits": {"L0": 6, "L1": 2, "L2": 1}, "misses": 1})
    assert ratios == {"L0": 0.6, "L1": 0.2, "L2": 0.1, "L3": 0.1}
    assert hit_ratios({}) == {t: None for t in TIERS}  # no acquire: undefined, not 0
    with pytest.raises(ValueError, match="scenarios"):
        ServeBenchConfig(scenarios=("nope",))
    with pytest.raises(ValueError, match="rate"):
        ServeBenchConfig(rate=0)
    with pytest.raises(ValueError, match="load"):
        ServeBenchConfig(load=0)
    with pytest.raises(ValueError, match="capacity_requests"):
        ServeBenchConfig(capacity_requests=0)
    derived = ServeBenchConfig(load=0.5, trace_requests=600)
    assert derived.trace_shape(capacity_rps=40.0) == (20.0, 30.0)  # half of capacity, 600 requests
    fixed = ServeBenchConfig(rate=8.0, duration_s=5.0)
    assert fixed.trace_shape(capacity_rps=40.0) == (8.0, 5.0)
    with pytest.raises(RuntimeError, match="capacity"):
        derived.trace_shape(capacity_rps=0.0)


def test_fleet_gives_the_storm_tenant_batch_class_and_quotas(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    from loraplex.artifacts.base_model import BaseModelSpec
    from loraplex.bench.serve.fleet import STORM_COLD_LOADS, STORM_GPU_SLOTS, prepare_fleet
    from loraplex.bench.workloads import ScenarioParams, cold_storm
    from loraplex.registry import PriorityClass, RegistryConfig, open_registry

    params = ScenarioParams(duration_s=1.0, rate=2.0, prompt_tokens=8, output_tokens=2,
                            num_adapters=2)  # fmt: skip
    one_each = {a.tenant: a for a in cold_storm(0, params).adapters}
    model_dir = demo_assets.base_model_dir
    fleet = prepare_fleet(tmp_path, model_dir, tuple(one_each.values()), 64, 0)
    base = BaseModelSpec.from_dir(model_dir)
    config = RegistryConfig(tmp_path, fleet.database_url, str(fleet.store), None, 64)
    registry = open_registry(config, base=base)
    try:
        storm, steady = registry.get_tenant("storm"), registry.get_tenant("steady-a")
    finally:
        registry.close()
    assert storm.priority is PriorityClass.BATCH
    assert storm.quotas.max_cold_loads == STORM_COLD_LOADS
    # Whole slots: a slot's bytes are rank 64 x the summed widths of every target module, > 0.
    assert storm.quotas.max_gpu_bytes is not None
    assert storm.quotas.max_gpu_bytes > 0 and storm.quotas.max_gpu_bytes % STORM_GPU_SLOTS == 0
    assert steady.priority is PriorityClass.NORMAL and steady.quotas.max_gpu_bytes is None
