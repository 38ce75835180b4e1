"""The test command lints too: ``ruff check`` over the package, the tests and ``scripts/``, and
``ruff format --check`` over all three (pyproject.toml's settings). Nothing in CI ran ruff, and
38 errors had gathered in scratch scripts under ``scripts/`` (modes-veto, merge-b2b, attack27)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINTED = ("loraplex", "tests", "scripts")


@pytest.mark.parametrize("command", [("check",), ("format", "--check")])
def test_ruff_finds_nothing(command: tuple[str, ...]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *command, *LINTED],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
