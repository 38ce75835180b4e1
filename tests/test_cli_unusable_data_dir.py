"""A ``--data-dir`` that is a file is named as such, by every command, before anything else is
said: a read-only registry command said "no registry at FILE/registry.sqlite3", and ``serve``
announced it was generating the demo set into it just before refusing it."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from loraplex.cli import app


@pytest.fixture
def not_a_dir(tmp_path: Path) -> Path:
    path = tmp_path / "file"
    path.write_text("")
    return path


@pytest.mark.parametrize("command", [["tenants", "list"], ["keys", "list"], ["adapters", "list"]])
def test_a_read_only_command_names_a_file_data_dir(command: list[str], not_a_dir: Path) -> None:
    result = CliRunner().invoke(app, [*command, "--data-dir", str(not_a_dir)])
    assert result.exit_code == 1, result.output
    assert result.output.strip() == f"error: cannot use {not_a_dir}: it is not a directory"


def test_serve_announces_no_demo_generation_into_a_file(not_a_dir: Path) -> None:
    args = ["serve", "--data-dir", str(not_a_dir), "--port", "0", "--engine-thread"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "generating the demo model" not in result.output
    assert f"error: cannot use {not_a_dir}: it is not a directory" in result.output
