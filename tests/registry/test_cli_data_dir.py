"""Registry commands on a data directory that holds no registry: the read-only ones (and those
changing what must already exist) refuse it instead of creating an empty registry there (a
mistyped ``--data-dir`` used to list nothing, successfully, and leave a new registry behind);
a data directory that cannot be one is one line on stderr, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from loraplex.cli import app

READ_ONLY = [
    ["adapters", "list"],
    ["adapters", "show", "acme/support"],
    ["tenants", "list"],
    ["keys", "list"],
    ["adapters", "alias", "show", "acme/support"],
    ["adapters", "alias", "history", "acme/support"],
    ["release", "status", "acme/support"],
    ["release", "list"],
]


@pytest.mark.parametrize("command", READ_ONLY, ids=" ".join)
def test_a_read_only_command_refuses_a_data_dir_without_a_registry(
    tmp_path: Path, command: list[str]
) -> None:
    typo = tmp_path / "typo"
    result = CliRunner().invoke(app, [*command, "--data-dir", str(typo)])
    assert result.exit_code == 1, result.output
    assert f"data_dir: no registry at {typo}" in result.output
    assert not typo.exists()


def test_creating_a_tenant_still_creates_the_registry(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["tenants", "create", "acme", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    listed = CliRunner().invoke(app, ["tenants", "list", "--data-dir", str(tmp_path)])
    assert listed.exit_code == 0 and "acme" in listed.output


def test_a_data_dir_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    result = CliRunner().invoke(app, ["tenants", "create", "acme", "--data-dir", str(not_a_dir)])
    assert result.exit_code == 1, result.output
    assert f"error: cannot use {not_a_dir}: it is not a directory" in result.output
    assert not isinstance(result.exception, OSError)


def test_serve_on_a_data_dir_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    args = ["serve", "--data-dir", str(not_a_dir), "--port", "0", "--engine-thread"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert f"error: cannot use {not_a_dir}: it is not a directory" in result.output
    assert not isinstance(result.exception, OSError)
