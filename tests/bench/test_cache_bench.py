"""The cache benchmark in a tiny configuration: the JSON line's shape, not timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loraplex.cli import app

METRICS = {
    "l2_load_over_raw",
    "l2_load_speedup_vs_peft",
    "l1_to_l0_over_copy",
    "l1_to_l0_full_over_copy",
    "hot_burst_hot_l0_hit_ratio",
    "hot_burst_reload_reduction_vs_lru",
}


@pytest.mark.slow
def test_bench_cache_emits_one_json_line(demo_assets, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    asset_dir = tmp_path / "assets"
    asset_dir.mkdir()
    (asset_dir / "bench-small").symlink_to(demo_assets.root)
    from loraplex.bench.cache.bench import CacheBenchConfig, run_cache_bench
    from loraplex.bench.cache.report import cache_markdown, cache_plot

    config = CacheBenchConfig(
        presets=("small",), reps=1, max_adapters=1, peft=False, duration_s=60.0, asset_dir=asset_dir
    )
    result = run_cache_bench(config)
    assert set(result["metrics"]) >= METRICS
    assert set(result["replays"]) == {
        "hot-burst", "hot-burst@12", "hot-burst@16", "zipf-longtail", "drift"
    }  # fmt: skip
    assert set(result["replays"]["hot-burst"]) == {
        "lru",
        "lru_priority",
        "cost_aware",
        "admit_gdsf",
    }
    assert set(result["replays"]["zipf-longtail"]) == {"lru", "cost_aware", "admit_gdsf"}
    metrics, burst = result["metrics"], result["replays"]["hot-burst"]
    # Both L1 -> L0 figures are ratios of medians over the same copy floor (no timing asserted);
    # the full-L0 one has its own samples (each load replaced a victim, or the rig raised).
    for name in ("l1_to_l0_over_copy", "l1_to_l0_full_over_copy"):
        assert isinstance(metrics[name], float) and metrics[name] > 0
    assert set(result["latency"]["small"]) >= {"l1", "l1_full", "copy"}
    assert metrics["l2_load_speedup_vs_peft"] is None  # PEFT was not run: undefined, not 0
    # Each headline comes from its replay (costs are measured in the run, so values vary).
    for policy, suffix in (
        ("cost_aware", ""),
        ("lru", "_lru"),
        ("lru_priority", "_lru_priority"),
        ("admit_gdsf", "_admit_gdsf"),
    ):
        during = burst[policy]["tenant_l0_hit_ratio"]["prio"]["during"]
        assert metrics[f"hot_burst_hot_l0_hit_ratio{suffix}"] == round(during, 4)
    reloads = {p: metrics[f"hot_burst_reloads_{p}"] for p in ("lru", "cost_aware")}
    assert reloads["lru"] == sum(burst["lru"]["reloads_after_eviction"].values())
    if reloads["cost_aware"]:
        expected = reloads["lru"] / reloads["cost_aware"]
        assert metrics["hot_burst_reload_reduction_vs_lru"] == round(expected, 4)
    else:  # undefined: null, never a made-up denominator
        assert metrics["hot_burst_reload_reduction_vs_lru"] is None
    # The price beside the gain: the batch tenant's P50 wait, cost_aware over lru.
    waits = {p: burst[p]["tenant_wait_s"]["batch"]["p50"] for p in ("cost_aware", "lru")}
    price = metrics["hot_burst_batch_p50_wait_cost_aware_over_lru"]
    assert price == round(waits["cost_aware"] / waits["lru"], 4)
    for slots in (9, 12, 16):
        assert f"hot_burst_s{slots}_batch_p50_wait_cost_aware_over_lru" in metrics
    json.dumps(result)
    cache_plot(result, tmp_path / "cache.png")
    assert (tmp_path / "cache.png").stat().st_size > 0
    assert "Trace replays" in cache_markdown(result, "cache.png")


def test_every_preset_reports_its_own_load_ratios() -> None:
    from loraplex.bench.cache.bench import load_metrics

    medians = {
        "small": {"l1": 0.5, "l1_full": 0.625, "copy": 0.125, "l2": 2.0, "raw": 1.0, "peft": 30.0},
        "large": {"l1": 2.0, "copy": 1.25, "l2": 15.0, "raw": 12.0},  # PEFT had no sample
    }
    metrics = load_metrics(("small", "large"), lambda p, c: medians[p].get(c), peft=True)
    assert metrics == {
        "l2_load_over_raw": 2.0,
        "l2_load_speedup_vs_peft": 15.0,
        "l1_to_l0_over_copy": 4.0,
        "l1_to_l0_full_over_copy": 5.0,
        "large_l2_load_over_raw": 1.25,
        "large_l2_load_speedup_vs_peft": None,  # undefined, never 0
        "large_l1_to_l0_over_copy": 1.6,
        "large_l1_to_l0_full_over_copy": None,  # no full-L0 sample: undefined, never 0
    }
    without_peft = load_metrics(("small", "large"), lambda p, c: medians[p].get(c), peft=False)
    assert "large_l2_load_speedup_vs_peft" not in without_peft
    assert without_peft["l2_load_speedup_vs_peft"] == 15.0


def test_cli_registers_cache_command() -> None:
    out = CliRunner().invoke(app, ["bench", "cache", "--help"])
    assert out.exit_code == 0 and "--json" in out.output


def test_cli_json_line_carries_the_latencies(monkeypatch: pytest.MonkeyPatch) -> None:
    """The printed line holds the per-column latencies each ratio is made of, not the ratios
    alone (the report file is optional: ``--report-dir ''`` writes none)."""
    from loraplex.bench.cache import bench

    latency = {"small": {"l1": {"p50_ms": 0.2}, "copy": {"p50_ms": 0.1}}}
    result = {
        "name": "cache",
        "config": {},
        "seed": 0,
        "metrics": {"l1_to_l0_over_copy": 2.0},
        "latency": latency,
        "stage_costs": {},
        "replays": {},
    }
    monkeypatch.setattr(bench, "run_cache_bench", lambda config: result)
    args = ["bench", "cache", "--presets", "small", "--no-peft", "--json", "--report-dir", ""]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    line = json.loads(out.output.strip().splitlines()[-1])
    assert line["latency"] == latency
    assert line["metrics"] == {"l1_to_l0_over_copy": 2.0}
    assert "replays" not in line  # the replays' detail stays in the report
