"""``bench traces`` end to end, tiny: both sides produce the same work, the traced side exports
real OTLP bytes, failures are counted, and the ratio is the traced over the untraced rate."""

from __future__ import annotations

from pathlib import Path

import pytest

from loraplex.bench.traces.bench import TraceBenchConfig, run_trace_bench
from loraplex.demo.assets import DemoAssets
from loraplex.serve.assembly import DEMO_DIR

pytestmark = pytest.mark.slow


def test_a_tiny_run_measures_both_sides(demo_assets: DemoAssets, tmp_path: Path) -> None:
    (tmp_path / DEMO_DIR).symlink_to(demo_assets.root, target_is_directory=True)
    config = TraceBenchConfig(
        data_dir=tmp_path, rounds=2, requests_per_round=4, concurrency=2, max_tokens=3,
        engine_process=False,
    )  # fmt: skip
    result = run_trace_bench(config)
    totals = result["totals"]
    assert totals["off"]["tokens"] == totals["on"]["tokens"] == 2 * 4 * 3  # same work
    assert totals["off"]["failed"] == totals["on"]["failed"] == 0
    assert result["exported_bytes"] > 0  # the traced rounds reached the sink
    off, on = result["tokens_per_s_untraced"], result["tokens_per_s_traced"]
    assert result["ratio_traced_over_untraced"] == pytest.approx(on / off)
    assert [r["side"] for r in result["rounds"]] == ["off", "on", "on", "off"]  # ABBA
    cpu_off, cpu_on = totals["off"]["cpu_s"], totals["on"]["cpu_s"]
    assert cpu_off > 0 and cpu_on > 0
    assert result["cpu_ratio_untraced_over_traced"] == pytest.approx(cpu_off / cpu_on)


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="rounds 0"):
        TraceBenchConfig(data_dir=Path("unused"), rounds=0)
