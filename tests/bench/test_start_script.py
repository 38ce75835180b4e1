"""``scripts/start-to-first-answer`` (docs/benchmarks/peer.md, "Start to first answer"): it
starts a real ``loraplex serve`` from a checkout as ``bench peer`` does, waits for the first
adapter's answer, and prints one JSON line per checkout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from loraplex.demo.assets import DemoAssets

REPO = Path(__file__).resolve().parents[2]


def test_one_start_of_this_checkout_answers(demo_assets: DemoAssets, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "start-to-first-answer"), "--trees", str(REPO),
         "--runs", "1", "--root", str(tmp_path), "--timeout-s", "120"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (line,) = done.stdout.splitlines()  # one checkout: no ratio line
    result = json.loads(line)
    assert result["tree"] == str(REPO)
    assert (result["starts"], result["failed"]) == (1, 0)
    assert 0 < result["median_s"] < 120  # a failed start would count at the timeout
    assert (tmp_path / "runs").is_dir()  # the server's logs are kept


def test_bad_runs_are_refused() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "start-to-first-answer"), "--trees", str(REPO),
         "--runs", "0"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--runs" in done.stderr
