"""A calibration's prefill steps as the engine timed them against what each step model prices them.

Reads a calibration's report (``sim calibrate --report`` or ``bench sim --logs-dir``'s
``calibration.samples.json``, written since the prefill-step term: ``prefill_timeline``, the
engine's first step of every lone warm request, and ``ttft_prefill_samples``) and its cost file,
refits the step line the older way from the same run (the decode samples with the TTFT-based
prefill samples, ``ipc_s`` the lone requests' median beyond it: what ``sim calibrate`` wrote
before the term), and prints per prompt length and adapter rank the engine's median step against
both models' prices, in ms, and each model's hop. ``--old-out`` writes the older model as a cost
file (the calibrated file with its step and ``ipc_s`` replaced) for ``offline.py``.

    python scripts/sim-timeline/prefill.py --report calibration.samples.json --cost cal.json \
        [--old-out cal-old.json]

With ``--rows`` (``logs.py --out``'s rows: each real request of a trace beside the simulated
one), per run, trace and leased tier instead: the median first step of the traces' requests as
the engine timed it and as the simulator priced it (``scheduled_s`` to ``first_step_end_s`` on
each side), in ms.

    python scripts/sim-timeline/prefill.py \
        --rows docs/benchmarks/sim-timeline-2026-12-05-simwarm.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from loraplex.sim import cost_model as cost_file
from loraplex.sim.calibrate import StepSample, fit_step, median_hop_s
from loraplex.sim.cost_model import CostModel, StepCost


def _price_ms(step: StepCost, s: StepSample) -> float:
    seconds = step.seconds(
        0, s.prefill_tokens, 1, s.rank_tokens,
        byte_tokens=s.byte_tokens, revision_widths=s.revision_widths,
    )  # fmt: skip
    return round(seconds * 1e3, 2)


def older_model(report: dict[str, Any], model: CostModel) -> CostModel:
    """The same run fitted as before the term: decode samples with the TTFT-based prefills."""
    decodes = [StepSample(**s) for s in report["step_samples"] if not s["prefill_tokens"]]
    ttft = [StepSample(**s) for s in report["ttft_prefill_samples"]]
    fitted = fit_step(decodes + ttft)
    lone = [(StepSample(**s), t) for s, t in report["lone_ttfts_s"]]
    ipc_s = median_hop_s(lone, fitted.step) if lone else fitted.ipc_s
    return replace(model, step=fitted.step, ipc_s=ipc_s or 0.0)


def rows(report: dict[str, Any], new: CostModel, old: CostModel) -> list[dict[str, Any]]:
    """Per timed (adapter, prompt length): the engine's median step and both prices, ms."""
    out = []
    for t in report["prefill_timeline"]:
        shape = StepSample(**t["sample"])
        steps = [v * 1e3 for v in t["steps_s"]]
        out.append(
            {
                "prompt_tokens": t["prompt_tokens"],
                "adapter": t["adapter"],
                "rank": t["rank"],
                "n": len(steps),
                "engine_ms": round(statistics.median(steps), 2),
                "engine_ms_range": [round(min(steps), 2), round(max(steps), 2)],
                "priced_ms_old": _price_ms(old.step, shape),
                "priced_ms_new": _price_ms(new.step, shape),
            }
        )
    return sorted(out, key=lambda r: (r["prompt_tokens"], r["rank"], r["adapter"]))


def first_steps(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (run, trace, tier): the real and the simulated first step's median, ms."""
    groups: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for row in lines:
        real, sim = row.get("engine") or {}, row.get("sim_engine") or {}
        if None in (real.get("first_step_end_s"), sim.get("first_step_end_s")):
            continue
        real_s = real["first_step_end_s"] - real["scheduled_s"]
        sim_s = sim["first_step_end_s"] - sim["scheduled_s"]
        pair = groups.setdefault((row["run"], str(row["real_tier"])), ([], []))
        pair[0].append(real_s * 1e3)
        pair[1].append(sim_s * 1e3)
    return [
        {
            "run": run,
            "tier": tier,
            "n": len(real),
            "engine_ms": round(statistics.median(real), 2),
            "simulated_ms": round(statistics.median(sim), 2),
        }
        for (run, tier), (real, sim) in sorted(groups.items())
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--report", type=Path)
    parser.add_argument("--cost", type=Path)
    parser.add_argument("--old-out", type=Path)
    parser.add_argument("--rows", type=Path)
    args = parser.parse_args()
    if args.rows is not None:
        text = args.rows.read_text(encoding="utf-8")
        for row in first_steps([json.loads(x) for x in text.splitlines() if x]):
            sys.stdout.write(json.dumps(row) + "\n")
        return
    if args.report is None or args.cost is None:
        sys.exit("--report and --cost are required (or --rows)")
    report = json.loads(args.report.read_text(encoding="utf-8"))
    if not report.get("prefill_timeline"):
        sys.exit(f"{args.report} holds no prefill_timeline (a run without the server's log)")
    new = cost_file.load(args.cost)
    old = older_model(report, new)
    for row in rows(report, new, old):
        sys.stdout.write(json.dumps(row) + "\n")
    for name, model in (("old", old), ("new", new)):
        hop = {"front_ms": round(model.front_s * 1e3, 2), "ipc_ms": round(model.ipc_s * 1e3, 2)}
        sys.stdout.write(f"{name} step {json.dumps(model.step.to_dict())} hop {json.dumps(hop)}\n")
    if args.old_out is not None:
        old.save(args.old_out)


if __name__ == "__main__":
    main()
