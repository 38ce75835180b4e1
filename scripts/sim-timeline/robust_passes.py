"""``bench sim --calibrate-interleaved``'s passes refitted offline with and without the rule that
leaves out a disturbed pass (``interleaved.disturbed_passes``; docs/simulator.md, "SIMBOTH").

Reads a hold's kept pass reports (``docs/benchmarks/sim-cost-*-simcal*-passes.json``: each pass's
``calibration-pN.samples.json``) and its ``sim-runs.jsonl`` line (the real side and which runs
each trace had), rebuilds each pass's measurements, and prints per pricing (all passes merged,
adjacent passes; each with every pass and with the disturbed ones left out) the fitted figures
and the single target's errors. The simulator is deterministic: no real run is needed.

The passes' request logs are not kept, so a merge's lease hand-offs (redone over the merged logs
in a run) are the median per tier of the chosen passes' own; the other figures are refitted as
in ``interleaved.merged`` and ``calibrate_fit.cost_model_from``.

    python scripts/sim-timeline/robust_passes.py 53 docs/benchmarks/…-simcal3-passes.json [DIR]

With DIR, every model is also written there (``every-pass-merged.json``,
``rule-adjacent-<trace>.json``, ...), for the simulator of another tree (the hold's own commit:
the simulator's cache code has changed since, so its hit ratios are not the hold's).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from loraplex.bench.sim.bench import prepared
from loraplex.bench.sim.calibrate_busy import BusySample
from loraplex.bench.sim.calibrate_cold import ColdSample, LeaseHandoffs
from loraplex.bench.sim.calibrate_decode import mix_record
from loraplex.bench.sim.calibrate_fit import cost_model_from
from loraplex.bench.sim.calibrate_run import CalibrateConfig
from loraplex.bench.sim.calibrate_target import Target
from loraplex.bench.sim.compare import compare_target, flat_errors
from loraplex.bench.sim.config import SimBenchConfig
from loraplex.bench.sim.interleaved import (
    LISTS,
    adjacent_passes,
    disturbed_passes,
    pass_figures,
)
from loraplex.bench.sim.simulated import simulated
from loraplex.demo.assets import generate_demo_assets
from loraplex.sim.calibrate import LoadSample, StepSample, fit_step
from loraplex.sim.cost_model import CostModel
from loraplex.sim.host_speed import HostProbe

RUNS = Path("docs/benchmarks/sim-runs.jsonl")
TARGET = Target("offline", "k", (), {}, 100, load_cpu_shared=True)


def measured_of(report: dict[str, Any]) -> dict[str, Any]:
    """One pass's ``calibration.measure`` result as far as its report holds it."""
    steps = [StepSample(**s) for s in report["step_samples"]]
    cold = [
        ColdSample(**{k: v for k, v in s.items() if k != "handoff_s"})
        for s in report["cold_samples"]
    ]
    found = report["lease_handoffs"]
    return {
        "loads": [LoadSample(**s) for s in report["load_samples"]],
        "steps": steps,
        # reports before 2026-12-05's CALFAULT kept no decode mix runs
        "decode_mixes": [mix_record(m) for m in report.get("decode_mixes", [])],
        "ttft_prefills": [StepSample(**s) for s in report["ttft_prefill_samples"]],
        "timings": [
            SimpleNamespace(
                adapter=SimpleNamespace(ref=t["adapter"], rank=t["rank"]),
                prompt_tokens=t["prompt_tokens"],
                steps_s=t["steps_s"],
            )
            for t in report["prefill_timeline"]
        ],
        "timed": [StepSample(**t["sample"]) for t in report["prefill_timeline"]],
        "cold": cold,
        # reports before SIMCOLD measured no load beside steps: load_busy_scale is then 1
        "busy": [
            BusySample(s["adapter"], s["lone_s"], s["busy_s"])
            for s in report.get("busy_samples", [])
        ],
        "residuals": report["hop_residuals_s"],
        "lone": [(StepSample(**s), t) for s, t in report["lone_ttfts_s"]],
        "front_s": report["overheads"]["front_s"],
        "step_fit": fit_step(steps),
        "handoffs": None if found is None else LeaseHandoffs(**found),
        "probes": [HostProbe(**p) for p in report["host_probes"]],
    }


def model_of(passes: Sequence[dict[str, Any]]) -> CostModel:
    """``interleaved.merged`` and ``cost_model_from`` on ``passes``, the hand-offs their median."""
    out: dict[str, Any] = {key: [x for m in passes for x in m[key]] for key in LISTS}
    out["step_fit"] = fit_step(out["steps"])
    out["front_s"] = statistics.median(m["front_s"] for m in passes)
    found = [m["handoffs"] for m in passes if m["handoffs"] is not None]
    out["handoffs"] = None
    if found:
        tiers = sorted({t for f in found for t in f.seconds})
        out["handoffs"] = LeaseHandoffs(
            seconds={
                t: statistics.median(f.seconds[t] for f in found if t in f.seconds) for t in tiers
            },
            counts={t: sum(f.counts.get(t, 0) for f in found) for t in tiers},
            at_once_plan_s=statistics.median(f.at_once_plan_s for f in found),
            at_once=sum(f.at_once for f in found),
        )
    probes = [p for m in passes for p in m["probes"]]
    model, _ = cost_model_from(
        TARGET, CalibrateConfig(), out, probes=probes, hardware="offline", command="offline"
    )
    return model


def _us(model: CostModel) -> str:
    f = pass_figures(model)
    return (
        f"decode {f['per_token_s'] * 1e6:.0f} us, fixed {f['step_fixed_s'] * 1e3:.2f} ms, prefill "
        f"{(f['per_prefill_token_s'] or 0) * 1e6:.1f} us, ipc {f['ipc_s'] * 1e3:.2f} ms"
    )


def main() -> None:
    line_no, path = int(sys.argv[1]), Path(sys.argv[2])
    out = Path(sys.argv[3]) if len(sys.argv) > 3 else None  # each model written here too
    line = json.loads(RUNS.read_text().splitlines()[line_no - 1])
    passes = [measured_of(r) for r in json.loads(path.read_text())]
    disturbed = disturbed_passes([p["step_fit"].step for p in passes])
    kept = [i for i in range(len(passes)) if i not in disturbed] or list(range(len(passes)))
    sys.stdout.write(f"line {line_no}: disturbed {disturbed}, kept {kept}\n")
    for i, p in enumerate(passes):
        sys.stdout.write(f"  pass {i}: {_us(model_of([p]))}\n")
    traces = line["metrics"]["targets"]["single"]["traces"]
    real = {n: {k: v for k, v in t["real"].items() if k != "runs"} for n, t in traces.items()}
    first = line["config"]
    config = SimBenchConfig(
        traces=tuple(first["traces"]), targets=("single",), trace_requests=first["trace_requests"],
        rate=first["rate"], seed=first["seed"], scale=None,
    )  # fmt: skip
    # the single runs in the order run: repeat r runs the traces forward on even r
    order = [
        n for r in range(first["repeats"]) for n in first["traces"][:: 1 if r % 2 == 0 else -1]
    ]
    assets = generate_demo_assets(config.asset_dir / "test-small", preset="small", seed=0)
    workloads = config.workloads()
    with tempfile.TemporaryDirectory(prefix="loraplex-robust-") as tmp:
        registry = prepared(config, workloads, Path(tmp), assets.base_model_dir)
        for label, chosen in (("every pass", list(range(len(passes)))), ("rule", kept)):
            whole = model_of([passes[i] for i in chosen])
            models = {}
            for name in dict.fromkeys(order):
                around = adjacent_passes([i for i, n in enumerate(order) if n == name], len(passes))
                mine = [i for i in around if i in chosen] or chosen
                models[name] = (mine, model_of([passes[i] for i in mine]))
            for how, price in (
                ("all merged", lambda target, trace, whole=whole: whole),
                ("adjacent", lambda target, trace, models=models: models[trace][1]),
            ):
                sims = simulated(config, workloads, price, registry)["single"]
                result = compare_target(real, sims, "single")
                errors = flat_errors({"single": result})
                per = {
                    n: (t["sim"]["ttft_ms"]["p50"], t["real"]["ttft_ms"]["p50"],
                        t["sim"]["ttft_ms"]["p99"], t["real"]["ttft_ms"]["p99"])
                    for n, t in result["traces"].items()
                }  # fmt: skip
                sys.stdout.write(f"{label}, {how}: {json.dumps(errors)}\n  per trace {per}\n")
            sys.stdout.write(f"  {label} merged: {_us(whole)}\n")
            if out is not None:
                tag = label.replace(" ", "-")
                whole.save(out / f"{tag}-merged.json")
                for name, (_, model) in models.items():
                    model.save(out / f"{tag}-adjacent-{name}.json")
            for name, (mine, model) in models.items():
                sys.stdout.write(f"  {label} adjacent {name} passes {mine}: {_us(model)}\n")


if __name__ == "__main__":
    main()
