"""``loraplex bench signing`` in a tiny configuration: the JSON line's shape, not timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loraplex.cli import app


@pytest.mark.slow
def test_bench_signing_emits_one_json_line(demo_assets, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    args = ["bench", "signing", "--reps", "2", "--max-adapters", "2"]
    result = CliRunner().invoke(app, [*args, "--asset-dir", str(demo_assets.root)])
    assert result.exit_code == 0, result.output
    line = json.loads(result.output.strip().splitlines()[-1])
    assert line["name"] == "signing_fetch_check"
    assert line["config"] == {"preset": "small", "reps": 2, "adapters": 2, "synthetic": False}
    metrics = line["metrics"]
    assert metrics["failures"] == 0  # every signed load passed the fetch-time check
    for name in ("l3_to_l0_unsigned", "l3_to_l0_signed", "check_alone"):
        assert set(metrics[name]) == {"p50_ms", "p95_ms", "p99_ms"}
        assert metrics[name]["p50_ms"] > 0
    assert metrics["check_over_unsigned_load_p50"] > 0


def test_bench_signing_refuses_bad_sizes() -> None:
    result = CliRunner().invoke(app, ["bench", "signing", "--reps", "0"])
    assert result.exit_code == 1 and "reps 0 is invalid" in result.output


def test_bench_signing_synthetic_shapes() -> None:
    args = ["bench", "signing", "--synthetic", "--reps", "1", "--max-adapters", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    line = json.loads(result.output.strip().splitlines()[-1])
    assert line["config"]["synthetic"] is True and line["metrics"]["failures"] == 0
    refused = CliRunner().invoke(app, [*args, "--asset-dir", "x"])
    assert refused.exit_code == 1 and "--asset-dir is invalid with --synthetic" in refused.output
