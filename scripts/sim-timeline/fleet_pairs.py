"""``bench sim --logs-dir``'s real fleet runs beside the simulator, request by request.

Reads each ``fleet-r<repeat>-<trace>.client.jsonl`` (the client's records: the tier the
request's replica reported at its arrival, its TTFT) of a logs directory, simulates the same
trace with the fleet's cost file (``--cost-model``; with ``--line``, a ``bench sim --json``
output line whose ``calibration_fleet_interleaved`` passes priced the run, each trace's
terms are fitted on the merged samples its adjacent passes kept in the logs directory, as the
bench fitted them; without those files, the mean of its adjacent passes' ``fleet_cpu_scale``,
``network_s`` and ``fleet_load_scale``, an approximation), pairs
the requests by trace position and prints per run: the (real tier, simulated tier) counts, the
TTFT medians (ms) of each group, the median per-request difference (real - simulated) of the
requests both sides call warm (L0) or not warm, and the simulated routing reasons beside the
run's real decisions. ``--no-load-scale`` leaves the passes' ``fleet_load_scale`` out (the
loads priced by ``fleet_cpu_scale``, as before it). ``--ask S`` sets the file's
``lease_ask_s`` (``--ask-split``: and takes S off each ``lease_handoff_s``, as a calibration
measuring the ask would).

    python scripts/sim-timeline/fleet_pairs.py --logs-dir logs --cost-model fleet.json \
        --trace-requests 64 --line run.json [--ask 0.0006 --ask-split] [--out rows.jsonl]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from logs import logged_runs

from loraplex.bench.sim.fleet_interleaved import fleet_terms
from loraplex.sim import cost_model as cost_file
from loraplex.sim.calibrate_fleet import FleetSample
from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import CostModel
from loraplex.sim.outcome import Outcome
from loraplex.sim.run import simulate


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x]


def _med(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def kept_models(
    base: CostModel, line: dict[str, Any] | None, logs_dir: Path, *, load_scale: bool = True
) -> dict[str, CostModel]:
    """Per trace: ``base`` with the fleet terms fitted as the bench fitted them, on the merged
    samples its adjacent passes kept in ``logs_dir`` (``fleet-calibration-p<i>.samples.json``;
    ``fleet_interleaved.fleet_terms``); {} without them. Without ``load_scale``, the fitted
    ``fleet_load_scale`` is left out."""
    passes = (line or {}).get("metrics", {}).get("calibration_fleet_interleaved")
    files = sorted(logs_dir.glob("fleet-calibration-p*.samples.json"))
    if not passes or not files:
        return {}
    kept = {
        int(f.name.split(".")[0].rsplit("-p", 1)[1]): [
            FleetSample(**x) for x in json.loads(f.read_text(encoding="utf-8"))["samples"]
        ]
        for f in files
    }
    out = {}
    for name, chosen in passes["adjacent"].items():
        samples = [x for i in chosen for x in kept[i]]
        model = fleet_terms(base, samples, base.cores or 2, f"passes {chosen}")
        out[name] = model if load_scale else replace(model, fleet_load_scale=None)
    return out


def trace_models(
    base: CostModel, line: dict[str, Any] | None, *, load_scale: bool = True
) -> dict[str, CostModel]:
    """Per trace: ``base`` with the mean of its adjacent fleet passes' terms ({}: none), their
    ``fleet_load_scale`` where they measured one (and ``load_scale``)."""
    passes = (line or {}).get("metrics", {}).get("calibration_fleet_interleaved")
    if not passes:
        return {}
    out = {}
    for name, chosen in passes["adjacent"].items():
        picked = [passes["passes"][i] for i in chosen]
        scale = statistics.fmean(p["fleet_cpu_scale"] for p in picked)
        network = statistics.fmean(p["network_s"] for p in picked)
        loads = [p["fleet_load_scale"] for p in picked if p.get("fleet_load_scale") is not None]
        fitted = statistics.fmean(loads) if loads and load_scale else None
        out[name] = replace(base, fleet_cpu_scale=scale, network_s=network, fleet_load_scale=fitted)
    return out


def rows_of(workload: Any, real: list[dict[str, Any]], sims: list[Outcome]) -> list[dict[str, Any]]:
    """One row per request: the trace's tenant, its real and simulated tier, TTFT (ms), and the
    simulated replica and routing reason."""
    if len(real) != len(sims) or len(real) != len(workload.requests):
        raise SystemExit(f"{workload.name}: {len(real)} real, {len(sims)} simulated requests")
    rows = []
    for request, r, s in zip(workload.requests, real, sims, strict=True):
        if r["tenant"] != request.tenant or s.tenant != request.tenant:
            raise SystemExit(f"{workload.name}: requests out of order at t_s {request.t_s}")
        sim_ttft = None if s.first_token_s is None else (s.first_token_s - s.t_s) * 1e3
        rows.append(
            {
                "t_s": request.t_s,
                "tenant": request.tenant,
                "adapter": request.adapter,
                "real_tier": r["tier"],
                "sim_tier": s.tier,
                "real_ttft_ms": None if r["ttft_s"] is None else r["ttft_s"] * 1e3,
                "sim_ttft_ms": sim_ttft,
                "sim_replica": s.replica,
                "sim_reason": s.reason,
            }
        )
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def warm(tier: str | None) -> str:
        return "L0" if tier == "L0" else "cold"

    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(f"{warm(row['real_tier'])}/{warm(row['sim_tier'])}", []).append(row)
    out: dict[str, Any] = {
        "tiers": dict(sorted(Counter(f"{r['real_tier']}/{r['sim_tier']}" for r in rows).items()))
    }
    for name, group in sorted(groups.items()):
        both = [r for r in group if r["real_ttft_ms"] is not None and r["sim_ttft_ms"] is not None]
        out[name] = {
            "n": len(group),
            "real_p50": _med([r["real_ttft_ms"] for r in both]),
            "sim_p50": _med([r["sim_ttft_ms"] for r in both]),
            "diff_p50": _med([r["real_ttft_ms"] - r["sim_ttft_ms"] for r in both]),
        }
    out["sim_reasons"] = dict(sorted(Counter(r["sim_reason"] for r in rows).items()))
    return out


def run_parser() -> argparse.ArgumentParser:
    """The arguments naming a recorded fleet run and its pricing (also ``fleet_in_flight.py``)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--logs-dir", type=Path, required=True)
    parser.add_argument("--cost-model", type=Path, required=True)
    parser.add_argument("--trace-requests", type=int, default=64)
    parser.add_argument("--line", type=Path, help="the run's bench sim --json output")
    return parser


def main() -> None:
    parser = run_parser()
    parser.add_argument("--ask", type=float, default=None)
    parser.add_argument("--ask-split", action="store_true")
    parser.add_argument("--no-load-scale", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    base = cost_file.load(args.cost_model)
    if args.ask is not None:
        handoffs = base.lease_handoff_s
        if args.ask_split:
            handoffs = {t: max(0.0, s - args.ask) for t, s in handoffs.items()}
        base = replace(base, lease_ask_s=args.ask, lease_handoff_s=handoffs)
    line = None if args.line is None else json.loads(args.line.read_text(encoding="utf-8"))
    with_scale = not args.no_load_scale
    models = kept_models(base, line, args.logs_dir, load_scale=with_scale) or trace_models(
        base, line, load_scale=with_scale
    )
    decisions: dict[str, list[dict[str, int]]] = {}
    if line is not None:
        for name, t in line["metrics"]["targets"]["fleet"]["traces"].items():
            decisions[name] = [r.get("decisions", {}) for r in t["real"].get("runs", [])]
    logged = logged_runs(args.logs_dir, args.trace_requests, "fleet")
    out = None if args.out is None else args.out.open("w", encoding="utf-8")
    for run in logged.runs:
        kept: list[Outcome] = []
        model = models.get(run.workload.name, base)
        simulate(run.trace, SimConfig(**logged.values), model, keep_outcomes=kept)
        rows = rows_of(run.workload, _lines(run.path), kept)
        if out is not None:
            for row in rows:
                out.write(json.dumps({"run": run.stem, **row}) + "\n")
        body = summary(rows)
        body["real_decisions"] = decisions.get(run.workload.name)
        sys.stdout.write(f"{run.stem} {json.dumps(body)}\n")


if __name__ == "__main__":
    main()
