"""``loraplex bench plan-check``: the planner's picks run on the real server (issue 30).

``loraplex plan`` picks a deployment per trace from simulated runs; this runs each given
deployment (``--configs``) on each trace on a fresh real ``loraplex serve`` of the demo model
(``validate.single_outcome``: ``bench serve``'s registry and launches, cold start, the store's
cached pages dropped), ``repeats`` times, the order of the (trace, config) runs reversed on
every other repeat (ABBA), and judges every run against the same objectives the planner used
(a ``judge`` the command line binds to ``plan.objectives``, the layer above this one). The
traces are the WORKLOADS.md generators; ``export_traces`` writes the very requests replayed
here as the JSONL the planner reads (each adapter's rank and bytes as served), so the planner
and the real server see one trace.

The real settings mirror the simulator's defaults the planner runs with: a client timeout of
60 s (the simulator's ``timeout_s``, the TTFT a failure counts as) and a queue deadline of half
of it (30 s, the simulator's ``queue_deadline_s``).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraplex.bench.harness.machine import machine_record
from loraplex.bench.harness.stats import ratio
from loraplex.bench.sim.trace_fields import GeneratedTraces
from loraplex.bench.sim.validate import MAX_LORA_RANK, RealSettings
from loraplex.bench.workloads import SCENARIOS, adapter_union

Judge = Callable[[Mapping[str, Any]], list[str]]  # an outcome -> the objectives it misses

TIMEOUT_S = 60.0  # the simulator's timeout_s; the queue deadline is half (its queue_deadline_s)


@dataclass(frozen=True)
class Deployment:
    """One single-server configuration checked: a planner candidate with one replica and the
    ``cost_aware`` eviction policy (the one ``validate.RealSettings`` serves)."""

    max_loras: int  # GPU slots
    cpu_adapter_bytes: int  # L1 budget

    def __post_init__(self) -> None:
        if self.max_loras < 1 or self.cpu_adapter_bytes < 1:
            raise ValueError(f"deployment {self} is invalid; expected slots and L1 bytes >= 1")

    def label(self) -> str:
        return f"slots={self.max_loras} cpu={self.cpu_adapter_bytes / (1 << 20):g}MiB"


@dataclass(frozen=True)
class TraceSet(GeneratedTraces):
    """The traces: WORKLOADS.md generators at one rate and length."""

    traces: tuple[str, ...]  # scenario names
    trace_requests: int = 240  # mean requests per trace
    rate: float = 2.0  # mean requests per second
    num_adapters: int = 200  # zipf-longtail's population (uniform has 200 of its own)
    prompt_tokens: int = 16
    output_tokens: int = 8
    seed: int = 0  # workloads and prompts

    def __post_init__(self) -> None:
        unknown = [t for t in self.traces if t not in SCENARIOS]
        if not self.traces or unknown or len(set(self.traces)) != len(self.traces):
            raise ValueError(
                f"traces {list(self.traces)} is invalid; expected distinct names from "
                f"{sorted(SCENARIOS)}"
            )
        self.params()  # raises ValueError naming a bad field


@dataclass(frozen=True)
class PlanCheckConfig:
    """What one ``bench plan-check`` invocation runs."""

    trace_set: TraceSet
    deployments: tuple[Deployment, ...]  # each run on each trace
    slo: tuple[str, ...]  # the objectives judged, as the planner writes them (the record's)
    repeats: int = 2  # each (trace, deployment) run this many times
    asset_dir: Path = Path(".loraplex-assets")  # the demo base model is <dir>/test-small

    def __post_init__(self) -> None:
        if not self.deployments or len(set(self.deployments)) != len(self.deployments):
            raise ValueError("deployments must be given and distinct")
        if not self.slo:
            raise ValueError("slo names no objective")
        if self.repeats < 1:
            raise ValueError(f"repeats {self.repeats} is invalid; expected >= 1")


def run_order(pairs: int, repeats: int) -> list[tuple[int, int]]:
    """(repeat, pair index) in run order: forward on even repeats, backward on odd (ABBA)."""
    out: list[tuple[int, int]] = []
    for repeat in range(repeats):
        indices = range(pairs) if repeat % 2 == 0 else range(pairs - 1, -1, -1)
        out.extend((repeat, i) for i in indices)
    return out


def export_traces(trace_set: TraceSet, model_dir: Path, directory: Path) -> dict[str, Any]:
    """Each trace as ``<directory>/<name>.jsonl`` (rows with rank and bytes as served) and the
    slot bytes per rank to give ``loraplex plan --bytes-per-rank``."""
    from loraplex.bench.sim.simulated import adapter_sizes
    from loraplex.bench.sim.traces import workload_rows

    directory.mkdir(parents=True, exist_ok=True)
    written: dict[str, Any] = {}
    per_rank = 0
    for workload in trace_set.workloads():
        sizes, per_rank = adapter_sizes(model_dir, list(workload.adapters))
        rows = workload_rows(workload, MAX_LORA_RANK, sizes)
        path = directory / f"{workload.name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        written[workload.name] = {"path": str(path), "requests": len(rows)}
    return {"traces": written, "bytes_per_rank": per_rank}


def summarize(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """trace -> deployment -> runs meeting the objectives, of how many, and the figures."""
    out: dict[str, dict[str, Any]] = {}
    for run in runs:
        cell = out.setdefault(run["trace"], {}).setdefault(
            run["deployment"], {"met": 0, "runs": 0, "ttft_p99_ms": [], "completed_ratio": []}
        )
        cell["runs"] += 1
        cell["met"] += int(not run["violations"])
        cell["ttft_p99_ms"].append(run["ttft_ms"]["p99"])
        cell["completed_ratio"].append(run["completed_ratio"])
    return out


def outcome_keys(outcome: Mapping[str, Any]) -> dict[str, Any]:
    """What a run record keeps of the real outcome, with machine seconds per correct request
    (one server: the makespan over completed requests; null when none completed). ``refused``
    (400 replies, by error code) is kept: those requests are in no TTFT percentile."""
    kept = ("requests", "completed", "completed_ratio", "ttft_ms", "makespan_s",
            "throughput_requests_per_s", "hit_ratio", "l0_loads", "refused")  # fmt: skip
    out = {k: outcome[k] for k in kept}
    out["machine_s_per_correct_request"] = ratio(outcome["makespan_s"], outcome["completed"], 4)
    return out


def run_plan_check(config: PlanCheckConfig, judge: Judge, single: Any = None) -> dict[str, Any]:
    """Every deployment on every trace, ``repeats`` times in ABBA order, each run's outcome
    judged by ``judge``; ``single`` replaces ``validate.single_outcome`` (tests)."""
    from loraplex.artifacts.base_model import BaseModelSpec
    from loraplex.bench.serve.driver import DriveConfig
    from loraplex.bench.serve.fleet import prepare_fleet
    from loraplex.demo.assets import generate_demo_assets

    if single is None:
        from loraplex.bench.sim.validate import single_outcome as single

    assets = generate_demo_assets(config.asset_dir / "test-small", preset="small", seed=0)
    vocab = BaseModelSpec.from_dir(assets.base_model_dir).vocab_size
    ts = config.trace_set
    workloads = ts.workloads()
    pairs = [(w, d) for w in workloads for d in config.deployments]
    drive = DriveConfig(request_timeout_s=TIMEOUT_S, vocab_size=vocab, seed=ts.seed)
    runs = []
    with tempfile.TemporaryDirectory(prefix="loraplex-plan-check-") as tmp:
        root = Path(tmp)
        union = adapter_union(w.adapters for w in workloads)  # the first definition of each
        registry = prepare_fleet(
            root / "registry", assets.base_model_dir, union, MAX_LORA_RANK, ts.seed
        )  # fmt: skip
        for n, (repeat, index) in enumerate(run_order(len(pairs), config.repeats)):
            workload, deployment = pairs[index]
            settings = RealSettings(
                max_loras=deployment.max_loras,
                cpu_adapter_bytes=deployment.cpu_adapter_bytes,
                request_timeout_s=TIMEOUT_S,
                seed=ts.seed,
            )
            load_before = machine_record()["load_1m"]
            outcome = single(registry, workload, settings, drive, root / f"run-{n}")
            record = {
                "repeat": repeat,
                "trace": workload.name,
                "deployment": deployment.label(),
                **outcome_keys(outcome),
                "load_1m_before": load_before,
                "load_1m_after": machine_record()["load_1m"],
            }
            record["violations"] = judge(outcome)
            runs.append(record)
    return {
        "name": "plan-check",
        "config": {
            "traces": list(ts.traces),
            "deployments": [d.label() for d in config.deployments],
            "eviction": "cost_aware",
            "slo": list(config.slo),
            "trace_requests": ts.trace_requests,
            "rate": ts.rate,
            "num_adapters": ts.num_adapters,
            "prompt_tokens": ts.prompt_tokens,
            "output_tokens": ts.output_tokens,
            "repeats": config.repeats,
            "timeout_s": TIMEOUT_S,
            "machine": machine_record(),
        },
        "seed": ts.seed,
        "runs": runs,
        "summary": summarize(runs),
    }
