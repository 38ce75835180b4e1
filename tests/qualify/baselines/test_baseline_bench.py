"""``loraplex bench baselines`` refuses what it cannot measure, by name, before it starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from loraplex.cli import app
from loraplex.demo.assets import DemoAssets
from loraplex.qualify.baselines.report import BaselinesBench


def test_bench_settings_are_validated_by_name() -> None:
    with pytest.raises(ValueError, match="shapes"):
        BaselinesBench(("tiny",), 4, 0.1, 60.0, 1.0, 0.1)
    with pytest.raises(ValueError, match="adapters"):
        BaselinesBench(("short",), 0, 0.1, 60.0, 1.0, 0.1)
    with pytest.raises(ValueError, match="tpot_slo_s"):
        BaselinesBench(("short",), 1, 0.1, 60.0, 1.0, 0.0)


def test_the_command_refuses_an_unknown_shape(demo_assets: DemoAssets, tmp_path: Path) -> None:
    args = ["bench", "baselines", "--assets", str(demo_assets.root), "--shapes", "short,huge"]
    result = CliRunner().invoke(app, [*args, "--workdir", str(tmp_path)])
    assert result.exit_code == 2
    assert "shapes" in result.output and "huge" in result.output
    assert not (tmp_path / "servers").exists()


def test_the_command_refuses_assets_of_another_preset(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    args = ["bench", "baselines", "--assets", str(demo_assets.root), "--preset", "large"]
    result = CliRunner().invoke(app, [*args, "--workdir", str(tmp_path)])
    assert result.exit_code == 2
    assert "preset 'large'" in result.output
    assert not (tmp_path / "servers").exists()


def test_the_command_refuses_an_unknown_preset_naming_the_presets(tmp_path: Path) -> None:
    """It said only that 'zz' did not match the set's own preset, not which names exist."""
    result = CliRunner().invoke(app, ["bench", "baselines", "--preset", "zz"])
    assert result.exit_code == 2
    assert "'zz' is not one of large, small" in result.output
