"""A registry command whose reader leaves (``loraplex release status ... | head -1``) exits
quietly: it printed "error: Broken pipe", an error about nothing the operator did wrong."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from loraplex.cli import app

REPO = Path(__file__).resolve().parents[1]


def test_a_closed_stdout_is_no_error(tmp_path: Path) -> None:
    created = CliRunner().invoke(app, ["tenants", "create", "acme", "--data-dir", str(tmp_path)])
    assert created.exit_code == 0, created.output
    command = [sys.executable, "-m", "loraplex", "tenants", "list", "--data-dir", str(tmp_path)]
    child = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # before the child has imported its command line, so before it writes
    stderr = child.stderr.read().decode()
    assert child.wait(timeout=120) == 1  # click's exit on EPIPE
    assert "error" not in stderr and "Traceback" not in stderr, stderr
