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
    "hot_burst_hot_l0_hit_ratio",
    "hot_burst_reload_reduction_vs_lru",
}


@pytest.mark.slow
def test_bench_cache_emits_one_json_line(demo_assets, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    asset_dir = tmp_path / "assets"
    asset_dir.mkdir()
    (asset_dir / "bench-small").symlink_to(demo_assets.root)
    from loraplex.bench.cache import CacheBenchConfig, run_cache_bench
    from loraplex.bench.cache_report import cache_markdown, cache_plot

    config = CacheBenchConfig(
        presets=("small",), reps=1, max_adapters=1, peft=False, duration_s=60.0, asset_dir=asset_dir
    )
    result = run_cache_bench(config)
    assert set(result["metrics"]) >= METRICS
    assert set(result["replays"]) == {"hot-burst", "zipf-longtail", "drift"}
    assert 0.0 <= result["metrics"]["hot_burst_hot_l0_hit_ratio"] <= 1.0
    json.dumps(result)
    cache_plot(result, tmp_path / "cache.png")
    assert (tmp_path / "cache.png").stat().st_size > 0
    assert "Trace replays" in cache_markdown(result, "cache.png")


def test_cli_registers_cache_command() -> None:
    out = CliRunner().invoke(app, ["bench", "cache", "--help"])
    assert out.exit_code == 0 and "--json" in out.output
