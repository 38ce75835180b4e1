"""A calibration report's decode samples timed both ways on the same runs (docs/simulator.md,
"CALFAULT"): on the engine's clock (what the report's fit used) and on the client's with the
0.1 ms rule (what the calibration did before), the prefill samples unchanged, each refitted.
Run-to-run noise is out of the comparison: both fits see the same requests.

    PYTHONPATH=. python scripts/calfault/paired.py docs/benchmarks/calfault-branch1-samples.json
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from loraplex.bench.sim.calibrate_decode import BURST_TPOT_S
from loraplex.sim.calibrate import StepFit, StepSample, fit_step


def client_step(mix: dict[str, Any]) -> float | None:
    """The mix's step on the client's clock: the median over its runs of each run's median
    client TPOT less those under ``BURST_TPOT_S`` (the calibration before CALFAULT)."""
    runs = []
    for run in mix["runs"]:
        kept = [t for t in run["client_tpots_s"] if t >= BURST_TPOT_S]
        if kept:
            runs.append(statistics.median(kept))
    runs = [t for t in runs if t > 0]
    return statistics.median(runs) if runs else None


def summary(fit: StepFit, clock: str, samples: list[StepSample]) -> dict[str, Any]:
    step = fit.step
    decodes = [s.step_s for s in samples if not s.prefill_tokens]
    r2 = fit.fit.r_squared
    return {
        "clock": clock,
        "per_token_ms": round(step.per_token_s * 1e3, 4),
        "step_fixed_ms": round(step.step_fixed_s * 1e3, 3),
        "per_revision_ms": round(step.per_revision_s * 1e3, 4),
        "per_prefill_token_us": step.per_prefill_token_s
        and round(step.per_prefill_token_s * 1e6, 3),
        "r2": None if r2 is None else round(r2, 4),
        "largest_residual_pct": round(fit.fit.max_rel_residual * 100, 1),
        "decode_min_ms": round(min(decodes) * 1e3, 4),
    }


def measurements(report: dict[str, Any]) -> list[tuple[str, list[dict], list[dict]]]:
    out = [("used", report["step_samples"], report["decode_mixes"])]
    check = report["fit_check"]
    if check.get("first_decode_mixes"):
        out.append(("first", check["first_step_samples"], check["first_decode_mixes"]))
    return out


def main() -> None:
    for path in sys.argv[1:]:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
        for which, rows, mixes in measurements(report):
            samples = [StepSample(**s) for s in rows]
            decodes = [i for i, s in enumerate(samples) if not s.prefill_tokens]
            sampled = [m for m in mixes if m["step_s"] is not None]  # in the samples' order
            client: list[StepSample | None] = list(samples)
            for i, mix in zip(decodes, sampled, strict=True):
                step = client_step(mix)
                client[i] = None if step is None else replace(samples[i], step_s=step)
            kept = [s for s in client if s is not None]
            runs = [run for m in mixes for run in m["runs"]]
            head = {
                "report": Path(path).name,
                "measurement": which,
                "client_bursts": sum(len(run["bursts_s"]) for run in runs),
                "client_0.1_to_1ms": sum(
                    1 for run in runs for t in run["client_tpots_s"] if BURST_TPOT_S <= t < 1e-3
                ),
            }
            lines = [head, summary(fit_step(samples), "engine", samples)]
            lines.append(summary(fit_step(kept), "client+rule", kept))
            sys.stdout.write("".join(json.dumps(x) + "\n" for x in lines))


if __name__ == "__main__":
    main()
