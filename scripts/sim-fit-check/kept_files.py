"""Which kept cost files (docs/benchmarks/sim-cost-*.json) ``sim calibrate``'s fit check
(``bench/sim/fit_check.py``) would refuse: each file's step fit refitted from its samples file
(``<name>-samples.json``, its ``step_samples``) where there is one, else the file's recorded fit
(its token prices, and the R^2 and largest residual its ``sources.step`` states). One JSON line
per file (``faults`` empty: it holds), then the refused files' names.

    PYTHONPATH=. python scripts/sim-fit-check/kept_files.py [--dir docs/benchmarks]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from loraplex.bench.sim.fit_check import recorded_step_fit, step_fit_faults
from loraplex.sim.calibrate import StepFit, StepSample, fit_step
from loraplex.sim.cost_model import load


def _fit(path: Path) -> tuple[StepFit, str]:
    """The file's step fit and where it came from."""
    samples = path.with_name(path.stem + "-samples.json")
    if samples.is_file():
        rows = json.loads(samples.read_text(encoding="utf-8")).get("step_samples")
        if rows:
            return fit_step([StepSample(**row) for row in rows]), "refitted from " + samples.name
    recorded = recorded_step_fit(load(path))
    if recorded is None:
        raise ValueError(f"{path}: no samples file and no recorded R^2 in sources.step")
    return recorded, "recorded"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("docs/benchmarks"))
    args = parser.parse_args()
    refused = []
    for path in sorted(args.dir.glob("sim-cost-*.json")):
        if path.stem.endswith(("-samples", "-passes")):
            continue
        fitted, origin = _fit(path)
        faults = step_fit_faults(fitted)
        r2 = fitted.fit.r_squared
        line = {
            "file": path.name,
            "fit": origin,
            "r_squared": None if r2 is None else round(r2, 4),
            "max_rel_residual": round(fitted.fit.max_rel_residual, 3),
            "per_prefill_token_s": fitted.step.per_prefill_token_s,
            "faults": faults,
        }
        sys.stdout.write(json.dumps(line) + "\n")
        if faults:
            refused.append(path.name)
    sys.stdout.write(json.dumps({"refused": refused, "count": len(refused)}) + "\n")


if __name__ == "__main__":
    main()
