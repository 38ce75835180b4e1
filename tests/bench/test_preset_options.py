"""A bench command given an unknown demo preset refuses it as a usage error naming the option
and the presets, before anything runs: ``bench modes --preset`` and ``bench cache --presets``
raised a traceback from the preset lookup once the run reached it."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from loraplex.bench.cache import bench as cache
from loraplex.bench.execution import bench as execution
from loraplex.bench.modes import bench as modes
from loraplex.cli import app


def _never(*args: object, **kwargs: object) -> None:
    raise AssertionError("the benchmark ran")


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["modes", "--preset", "tiny"], "--preset"),
        (["execution", "--preset", "tiny"], "--preset"),
        (["cache", "--presets", "small,tiny"], "--presets"),
    ],
)
def test_an_unknown_preset_is_a_usage_error_naming_the_option(
    monkeypatch: pytest.MonkeyPatch, args: list[str], option: str
) -> None:
    monkeypatch.setattr(modes, "run_modes_bench", _never)
    monkeypatch.setattr(execution, "run_execution_bench", _never)
    monkeypatch.setattr(cache, "run_cache_bench", _never)
    result = CliRunner().invoke(app, ["bench", *args, "--json"])
    assert result.exit_code == 2, result.output
    out = " ".join(result.output.replace("\u2502", " ").split())  # without typer's error box
    assert f"Invalid value for {option}: 'tiny' is not one of large, small" in out
    assert "Traceback" not in out and "Value error" not in out
