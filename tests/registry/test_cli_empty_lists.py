"""An empty page of ``tenants list``, ``adapters list`` or ``keys list`` prints nothing on
stdout (a script reads an empty list; exit 0) and says so on stderr, as ``release list`` does.
NOTE: they printed nothing at all, which read as a command that failed."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from loraplex.cli import app


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    created = CliRunner().invoke(app, ["tenants", "create", "acme", "--data-dir", str(tmp_path)])
    assert created.exit_code == 0, created.output
    return tmp_path


EMPTY = [
    (["tenants", "list", "--after", "acme"], "no tenant after acme"),
    (["adapters", "list"], "no adapter"),
    (["adapters", "list", "--tenant", "acme"], "no adapter usable by tenant 'acme'"),
    (["adapters", "list", "--after", "acme/bot"], "no adapter after acme/bot"),
    (["keys", "list"], "no key"),
    (["keys", "list", "--tenant", "acme"], "no key of tenant 'acme'"),
]


@pytest.mark.parametrize(("args", "said"), EMPTY, ids=[" ".join(args) for args, _ in EMPTY])
def test_an_empty_page_says_so_on_stderr_only(data_dir: Path, args: list[str], said: str) -> None:
    result = CliRunner().invoke(app, [*args, "--data-dir", str(data_dir)])
    assert result.exit_code == 0, result.output
    assert (result.stdout, result.stderr) == ("", said + "\n")


def test_a_page_with_rows_says_nothing_more(data_dir: Path) -> None:
    result = CliRunner().invoke(app, ["tenants", "list", "--data-dir", str(data_dir)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("acme\t") and result.stderr == ""
