"""``scripts/sim-hot-one/study.py`` and ``split_bound.py`` price with ``--cost-model`` (default the
example fleet file, docs/simulator.md): they named the undated ``-fleet`` file, which the fit
check fails, with no way to pass another."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "sim-hot-one"
UNDATED = "docs/benchmarks/sim-cost-cpu-2core-demo-small-fleet.json"  # the recorded studies'
EXAMPLE = "docs/benchmarks/sim-cost-cpu-2core-demo-small-2026-12-05-both20-fleet.json"


def _lines(script: str, *args: str) -> list[dict[str, object]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / script), *args],
        check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_study_prices_with_the_cost_model_it_is_given() -> None:
    lone = ("--lone", "--rates", "20", "--duration-s", "5")
    default = _lines("study.py", *lone)
    assert default == _lines("study.py", *lone, "--cost-model", EXAMPLE)
    undated = _lines("study.py", *lone, "--cost-model", UNDATED)
    assert len(default) == len(undated) == 1 and default != undated


def test_split_bound_prices_with_the_cost_model_it_is_given() -> None:
    run = ("--rates", "20", "--seeds", "1", "--duration-s", "5")
    assert _lines("split_bound.py", *run) != _lines("split_bound.py", *run, "--cost-model", UNDATED)
