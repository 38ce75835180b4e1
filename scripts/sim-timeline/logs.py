"""``bench sim --logs-dir``'s real single-server runs beside the simulator, request by request.

Reads a logs directory (``validate.RunLogs``: per run ``single-r<repeat>-<trace>.requests.jsonl``,
the server's request log, and ``.client.jsonl``, the client's records; the in-run
calibration's ``calibration.requests.jsonl``), simulates the same traces with ``--cost-model``
(``probe.simulated_outcomes``: the simulator's per-request times), pairs each real request with
its simulated one (``probe.paired``) and prints, per run, the medians per leased tier of
``probe.summary`` (ms). Then the calibration's lone warm requests (leased from a GPU slot,
``--output-tokens`` tokens, ``--prompt-tokens`` prompt) against the runs' warm requests of the
same shape: their front TTFT and engine stages, side by side. ``logged_runs`` (the runs of a
target, their traces, adapter sizes and simulator config) also serves ``fleet_pairs.py`` and
``busy_loads.py``.

    python scripts/sim-timeline/logs.py --logs-dir /tmp/logs --cost-model cal.json \
        --trace-requests 192 [--out rows.jsonl]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe import paired, simulated_outcomes, summary

from loraplex.bench.sim.bench import prepared
from loraplex.bench.sim.config import SimBenchConfig
from loraplex.bench.sim.simulated import adapter_sizes, registry_tenants, sim_config
from loraplex.bench.sim.traces import workload_rows
from loraplex.bench.sim.validate import MAX_LORA_RANK
from loraplex.bench.workloads import Workload
from loraplex.sim import cost_model as cost_file
from loraplex.sim.call import records

# The engine's stages compared (``request_log.ENGINE_FIELDS``), and the front's TTFT.
STAGES = ("scheduled_s", "first_step_end_s", "lease_s", "asked_s")


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x]


def _med(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def stage_medians(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians, ms, of the front's TTFT, the engine's stages and what lies outside the engine
    (front TTFT less the first step's end) over ``lines``."""
    out: dict[str, Any] = {"n": len(lines)}
    out["front_ttft"] = _med([x["ttft_s"] * 1e3 for x in lines if x["ttft_s"] is not None])
    for name in STAGES:
        kept = [x["engine"][name] for x in lines if x["engine"].get(name) is not None]
        out[name] = _med([v * 1e3 for v in kept])
    out["first_step"] = _med(
        [
            (x["engine"]["first_step_end_s"] - x["engine"]["scheduled_s"]) * 1e3
            for x in lines
            if x["engine"].get("first_step_end_s") is not None
        ]
    )
    out["outside_engine"] = _med(
        [
            (x["ttft_s"] - x["engine"]["first_step_end_s"]) * 1e3
            for x in lines
            if x["ttft_s"] is not None and x["engine"].get("first_step_end_s") is not None
        ]
    )
    return out


def warm(lines: list[dict[str, Any]], prompt: int, output: int) -> list[dict[str, Any]]:
    return [
        x
        for x in lines
        if x["tier"] == "L0"
        and x["engine"]
        and x["prompt_tokens"] == prompt
        and x["output_tokens"] == output
    ]


# Each target's logs read per run: the server's request log (single), the client's records
# (fleet: the tier its replica reported, its TTFT).
RUN_LOGS = {"single": "requests.jsonl", "fleet": "client.jsonl"}


@dataclass(frozen=True)
class LoggedRun:
    """One real run of a logs directory, with its trace as the simulator reads it."""

    path: Path  # its log (``RUN_LOGS``)
    stem: str  # ``<target>-r<repeat>-<trace>``
    workload: Workload  # the trace's workload, as bench sim generated it
    trace: list[Any]  # that workload's requests as the simulator's records, sizes as served


@dataclass(frozen=True)
class LoggedRuns:
    """A logs directory's runs of one target and what simulating them needs."""

    runs: list[LoggedRun]  # by file name
    values: dict[str, Any]  # SimConfig fields mirroring the target's deployment
    sizes: dict[tuple[str, str], int]  # (tenant, adapter name) -> bytes as served


def logged_runs(logs_dir: Path, trace_requests: int, target: str = "single") -> LoggedRuns:
    """``logs_dir``'s runs of ``target`` (``RUN_LOGS``), with the traces, adapter sizes and
    simulator config bench sim used: the demo assets, and its registry prepared in a temporary
    directory (for the adapters' sizes and the tenants' settings)."""
    from loraplex.demo.assets import generate_demo_assets

    paths = sorted(logs_dir.glob(f"{target}-r*-*.{RUN_LOGS[target]}"))
    stems = [p.name.split(".")[0] for p in paths]
    names = sorted({stem.split("-", 2)[2] for stem in stems})
    config = SimBenchConfig(
        traces=tuple(names), targets=(target,), trace_requests=trace_requests, scale=None
    )
    assets = generate_demo_assets(config.asset_dir / "test-small", preset="small", seed=0)
    workloads = {w.name: w for w in config.workloads()}
    with tempfile.TemporaryDirectory(prefix="loraplex-logs-") as tmp:
        registry = prepared(config, list(workloads.values()), Path(tmp), assets.base_model_dir)
        adapters = [a for w in workloads.values() for a in w.adapters]
        sizes, per_rank = adapter_sizes(registry.model_dir, adapters)
        values = sim_config(config, target, per_rank, registry_tenants(registry))
    runs = []
    for path, stem in zip(paths, stems, strict=True):
        w = workloads[stem.split("-", 2)[2]]
        runs.append(LoggedRun(path, stem, w, records(workload_rows(w, MAX_LORA_RANK, sizes))))
    return LoggedRuns(runs, values, sizes)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--logs-dir", type=Path, required=True)
    parser.add_argument("--cost-model", type=Path, required=True)
    parser.add_argument("--trace-requests", type=int, default=192)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--output-tokens", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    cost = cost_file.load(args.cost_model)
    logged = logged_runs(args.logs_dir, args.trace_requests)
    out = None if args.out is None else args.out.open("w", encoding="utf-8")
    trace_warm: list[dict[str, Any]] = []
    for run in logged.runs:
        sims, stamps = simulated_outcomes(run.trace, logged.values, cost)
        lines = _lines(run.path)
        client = args.logs_dir / f"{run.stem}.client.jsonl"
        recs = [SimpleNamespace(**r) for r in _lines(client)]
        rows = paired(run.workload, recs, lines, sims, stamps)
        if out is not None:
            for row in rows:
                out.write(json.dumps({"run": run.stem, **row}) + "\n")
        sys.stdout.write(f"{run.stem} {json.dumps(summary(rows))}\n")
        trace_warm.extend(warm(lines, args.prompt_tokens, args.output_tokens))
    calibration = args.logs_dir / "calibration.requests.jsonl"
    if calibration.is_file():
        lone = warm(_lines(calibration), args.prompt_tokens, args.output_tokens)
        sys.stdout.write(f"calibration lone warm {json.dumps(stage_medians(lone))}\n")
        sys.stdout.write(f"traces warm {json.dumps(stage_medians(trace_warm))}\n")


if __name__ == "__main__":
    main()
