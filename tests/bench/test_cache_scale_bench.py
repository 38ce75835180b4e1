"""``loraplex bench cache --scale`` at 5 and 20 copies: the JSON line's names and that every
value is a positive finite number or null; never timings."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.bench.cache.scale import (
    ScaleBenchConfig,
    fill_disk_tier,
    ratio,
    size_label,
)
from loraplex.bench.synthetic import SyntheticAdapters
from loraplex.cli import app
from loraplex.demo.assets import DemoAssets
from loraplex.runtime.tier_backends import DiskTier

HEADLINE = (
    "place_cost_20_over_5",
    "place_cost_free_room_20_over_5",
    "place_cost_eviction_20_over_5",
    "idle_cpu_20_over_5",
    "metrics_latency_20_over_5",
    "recover_s_per_1k_copies",
    "recover_s_per_1k_copies_20_over_5",
    "recover_s_per_1k_copies_5",
    "recover_s_per_1k_copies_20",
)
PER_SIZE = {
    "engine_start_s",
    "idle_cpu_engine",
    "idle_cpu_server",
    "metrics_ms",
    "recover_s",
    "recover_s_per_1k_copies",
    "place_free_room_ms",
    "place_eviction_ms",
}
# Measured durations: every one of them took time. CPU may read 0 over a short idle window.
NEVER_ZERO = PER_SIZE - {"idle_cpu_engine", "idle_cpu_server"}


@pytest.mark.slow
def test_scale_bench_emits_one_json_line(demo_assets: DemoAssets) -> None:
    args = [
        "bench",
        "cache",
        "--scale",
        "--quick",
        "--sizes",
        "5,20",
        "--asset-dir",
        str(demo_assets.root.parent),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1
    line = json.loads(lines[0])
    assert set(line) == {"name", "config", "seed", "metrics", "per_size"}
    assert line["name"] == "cache-scale" and line["config"]["sizes"] == [5, 20]
    assert set(line["metrics"]) == set(HEADLINE)
    for name, value in line["metrics"].items():
        assert value is None or (math.isfinite(value) and value > 0), (name, value)
    assert set(line["per_size"]) == {"5", "20"}
    for row in line["per_size"].values():
        assert set(row) == PER_SIZE
        assert all(math.isfinite(row[k]) and row[k] > 0 for k in NEVER_ZERO), row
        assert all(row[k] >= 0 for k in PER_SIZE - NEVER_ZERO), row


def test_disk_tier_fill_gives_distinct_recoverable_copies(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    base = BaseModelSpec.from_dir(demo_assets.base_model_dir)
    made = fill_disk_tier(tmp_path / "l2", base, SyntheticAdapters(base), 12)
    assert len({a.key.adapter_digest for a in made}) == 12
    recovered = DiskTier(tmp_path / "l2").recover(base, 1)
    assert {c.key for c in recovered} == {a.key for a in made}


def test_ratios_and_labels() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(1.0, 0.0) is None and ratio(None, 1.0) is None and ratio(1.0, None) is None
    assert [size_label(n) for n in (5, 100, 1000, 10_000, 1500)] == [
        "5",
        "100",
        "1k",
        "10k",
        "1500",
    ]
    with pytest.raises(ValueError, match="sizes"):
        ScaleBenchConfig(sizes=(100,))
    with pytest.raises(ValueError, match="loads"):
        ScaleBenchConfig(loads=0)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--scale", "--reps", "3"], "reps cannot be used with --scale"),
        (["--scale", "--presets", "small"], "presets cannot be used with --scale"),
        (["--quick"], "quick cannot be used without --scale"),
        (["--sizes", "5,10"], "sizes cannot be used without --scale"),
    ],
)
def test_an_option_of_the_other_mode_is_refused_not_ignored(args: list[str], named: str) -> None:
    result = CliRunner().invoke(app, ["bench", "cache", *args])
    assert result.exit_code == 2 and named in " ".join(result.output.split())
