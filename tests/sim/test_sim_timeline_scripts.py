"""``scripts/sim-timeline/offline_fleet.py``, ``offline.py`` and ``refit_fleet.py`` run to the
end against stored lines of ``docs/benchmarks/sim-runs.jsonl`` and stored cost files (they hand
``simulated`` a pricing, ``bench.priced``, not a cost model: after ``simulated`` took a pricing
callable all three failed with "'CostModel' object is not callable")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "sim-timeline"
# a calibration the fit check holds (SIMCAL2; docs/simulator.md, SIMCOLD)
COST = "docs/benchmarks/sim-cost-cpu-2core-demo-small-2026-12-05-both20.json"
LINE = "57"  # a bench sim line with both targets, 64 requests a trace


def _run(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, *args]
    done = subprocess.run(
        command, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_offline_fleet_prints_the_fleet_errors_of_each_variant() -> None:
    out = _run(str(SCRIPTS / "offline_fleet.py"), LINE, f"{COST}:none").splitlines()
    assert len(out) == 1 and out[0].startswith(f"{COST}:none line {LINE}: ")
    assert "ttft_p50_rel_error" in out[0] and "'zipf-longtail'" in out[0]


def test_offline_prints_the_single_errors_of_each_cost_file() -> None:
    out = _run(str(SCRIPTS / "offline.py"), "--lines", LINE, "--cost", COST).splitlines()
    assert len(out) == 1 and out[0].startswith(f"{Path(COST).name} line {LINE}: hit ")


def test_refit_fleet_prints_the_refitted_curve_and_the_fleet_errors() -> None:
    out = _run(str(SCRIPTS / "refit_fleet.py"), "spread4", "47").splitlines()
    assert out[1].startswith("fitted ") and out[2].startswith("errors ")
    assert len(out) == 6  # and one line per trace


def test_robust_passes_names_the_disturbed_pass_and_writes_each_model(tmp_path: Path) -> None:
    """SIMCAL's hold 3 (line 53): pass 0's prefill price fitted to 0 is left out (SIMBOTH)."""
    passes = "docs/benchmarks/sim-cost-cpu-2core-demo-small-2026-12-05-simcal3-passes.json"
    out = _run(str(SCRIPTS / "robust_passes.py"), "53", passes, str(tmp_path)).splitlines()
    assert out[0] == "line 53: disturbed {0: 'per_prefill_token_s fitted to 0'}, kept [1, 2, 3]"
    assert sum(line.startswith(("every pass, ", "rule, ")) for line in out) == 4
    written = sorted(p.name for p in tmp_path.iterdir())
    assert "rule-adjacent-zipf-longtail.json" in written and "every-pass-merged.json" in written
    assert len(written) == 8  # merged and one per trace, with and without the rule
