"""Per-request timelines of ``bench sim``'s single server beside the simulator's (issue 30).

Runs ``bench sim``'s own single-server path (``prepared``, ``RealSettings``, a fresh
``loraplex serve`` per trace, ``replay_over_http``) with the server's request log on, so every
request carries the engine's timeline (``server/request_log.ENGINE_FIELDS``), and simulates the
same trace with a cost file, keeping each simulated request's outcome. Requests are paired by
(tenant, adapter) in arrival order. Writes one JSON object per request to ``--out`` and prints
medians per tier (ms) of: TTFT real and simulated, the engine's stages.

    flock /work/bench.lock nice -n -5 python scripts/sim-timeline/probe.py \
        --cost-model docs/benchmarks/sim-cost-cpu-2core-demo-small-2026-12-05-both20.json \
        --trace-requests 192 --out /tmp/timeline.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

from loraplex.bench.serve.driver import DriveConfig, replay_over_http
from loraplex.bench.serve.fleet import drop_page_cache, serving
from loraplex.bench.sim.bench import prepared
from loraplex.bench.sim.config import SimBenchConfig
from loraplex.bench.sim.simulated import adapter_sizes, registry_tenants, sim_config
from loraplex.bench.sim.traces import workload_rows
from loraplex.bench.sim.validate import MAX_LORA_RANK
from loraplex.sim import cost_model as cost_file
from loraplex.sim import run as sim_run
from loraplex.sim.call import records
from loraplex.sim.config import SimConfig
from loraplex.sim.lease_desk import SimLeaseDesk
from loraplex.sim.replica import SimReplica


def simulated_outcomes(
    trace: list[Any], values: dict[str, Any], cost: Any
) -> tuple[list[Any], dict[int, dict[str, float | None]]]:
    """The simulator's per-request outcomes, in trace order, and each one's engine timeline
    (seconds after its engine arrival, as the request log's; ``simulate`` keeps neither:
    ``_result``, the lease desk's ``_settle`` and the replica's ``_retire`` are wrapped)."""
    kept: list[Any] = []
    stamps: dict[int, dict[str, float | None]] = {}
    original = sim_run._result
    settle, retire = SimLeaseDesk._settle, SimReplica._retire

    def keep(*args: Any, **kwargs: Any) -> Any:
        kept.extend(kwargs["outcomes"])
        return original(*args, **kwargs)

    def on_settle(self: Any, req: Any, future: Any) -> None:
        settle(self, req, future)
        outcome = self._outcomes.get(req.request_id)
        if outcome is not None:
            stamps.setdefault(id(outcome), {})["lease_s"] = self._clock.now() - req.arrival_s

    def on_retire(self: Any, req: Any, state: Any, error: Any) -> None:
        outcome = self._outcomes.get(req.request_id)
        if outcome is not None:
            s = stamps.setdefault(id(outcome), {})
            s["arrival_abs"] = req.arrival_s
            first = req.first_scheduled_s
            s["scheduled_s"] = None if first is None else first - req.arrival_s
        retire(self, req, state, error)

    sim_run._result = keep  # type: ignore[assignment]
    SimLeaseDesk._settle = on_settle  # type: ignore[method-assign]
    SimReplica._retire = on_retire  # type: ignore[method-assign]
    try:
        sim_run.simulate(trace, SimConfig(**values), cost)
    finally:
        sim_run._result = original  # type: ignore[assignment]
        SimLeaseDesk._settle = settle  # type: ignore[method-assign]
        SimReplica._retire = retire  # type: ignore[method-assign]
    timelines = {}
    for i, o in enumerate(kept):
        s = stamps.get(id(o), {})
        arrival = s.get("arrival_abs")
        timelines[i] = {
            "hop_s": None if arrival is None else arrival - o.t_s,
            "lease_s": s.get("lease_s"),
            "scheduled_s": s.get("scheduled_s"),
            "first_step_end_s": None
            if arrival is None or o.first_token_s is None
            else o.first_token_s - arrival,
        }
    return kept, timelines


def real_run(registry: Any, workload: Any, config: SimBenchConfig, root: Path, vocab: int) -> Any:
    s = config.settings
    drive = DriveConfig(request_timeout_s=s.request_timeout_s, vocab_size=vocab, seed=s.seed)
    root.mkdir(parents=True)
    log = root / "requests.jsonl"
    options = s.options()
    options = replace(options, request_log_path=log)
    drop_page_cache(registry.store)
    with serving(registry, root, options) as url:
        recs, _ = asyncio.run(
            replay_over_http(url, workload.requests, registry.keys, registry.admin_key, drive)
        )
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    return recs, lines


def paired(
    workload: Any, recs: list[Any], lines: list[Any], sims: list[Any], stamps: dict[int, Any]
) -> list[dict]:
    by_key: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for line in sorted(lines, key=lambda x: x["t_s"]):
        by_key[(line["tenant"], line["adapter"].partition("@")[0])].append(line)
    rows = []
    for i, (request, rec, sim) in enumerate(zip(workload.requests, recs, sims, strict=True)):
        line = by_key[(request.tenant, request.adapter)].pop(0)
        rows.append(
            {
                "t_s": request.t_s,
                "tenant": request.tenant,
                "adapter": request.adapter,
                "client_tier": rec.tier,
                "real_tier": line["tier"],
                "sim_tier": sim.tier,
                "real_ttft_ms": None if rec.ttft_s is None else rec.ttft_s * 1e3,
                "log_ttft_ms": None if line["ttft_s"] is None else line["ttft_s"] * 1e3,
                "sim_ttft_ms": None
                if sim.first_token_s is None
                else (sim.first_token_s - sim.t_s) * 1e3,
                "engine": line["engine"],
                "sim_engine": stamps[i],
            }
        )
    return rows


def _med(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def _field(e: dict | None, name: str) -> float | None:
    if e is None or e.get(name) is None:
        return None
    return float(e[name]) * 1e3


def _gap(e: dict | None, a: str, b: str) -> float | None:
    x, y = _field(e, a), _field(e, b)
    return None if x is None or y is None else y - x


def summary(rows: list[dict]) -> dict[str, Any]:
    """Medians per tier the server leased from, ms: real and simulated."""
    out: dict[str, Any] = {}
    for tier in ("L0", "L1", "L2", "L3"):
        group = [r for r in rows if r["real_tier"] == tier and r["engine"] and r["real_ttft_ms"]]
        if not group:
            continue
        parts: dict[str, list[float | None]] = defaultdict(list)
        for r in group:
            e, m = r["engine"], r["sim_engine"]
            parts["ttft"].append(r["real_ttft_ms"])
            parts["sim_ttft"].append(r["sim_ttft_ms"])
            parts["front_ttft"].append(r["log_ttft_ms"])
            parts["client_to_front"].append(r["real_ttft_ms"] - r["log_ttft_ms"])
            fse = _field(e, "first_step_end_s")
            parts["front_out_of_engine"].append(None if fse is None else r["log_ttft_ms"] - fse)
            parts["sim_hop"].append(_field(m, "hop_s"))
            parts["asked"].append(_field(e, "asked_s"))
            parts["asked_to_ready"].append(_gap(e, "asked_s", "ready_s"))
            parts["load"].append(_field(e, "load_s"))
            parts["ready_to_lease"].append(_gap(e, "ready_s", "lease_s"))
            parts["lease"].append(_field(e, "lease_s"))
            parts["sim_lease"].append(_field(m, "lease_s"))
            parts["lease_to_plan"].append(_gap(e, "lease_s", "scheduled_s"))
            parts["sim_lease_to_plan"].append(_gap(m, "lease_s", "scheduled_s"))
            parts["plan"].append(_field(e, "scheduled_s"))
            parts["sim_plan"].append(_field(m, "scheduled_s"))
            parts["first_step"].append(_gap(e, "scheduled_s", "first_step_end_s"))
            parts["sim_first_step"].append(_gap(m, "scheduled_s", "first_step_end_s"))
            parts["engine"].append(fse)
            parts["sim_engine"].append(_field(m, "first_step_end_s"))
        out[tier] = {"n": len(group), "sim_same_tier": sum(r["sim_tier"] == tier for r in group)}
        for name, values in parts.items():
            out[tier][name] = _med([v for v in values if v is not None])
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cost-model", type=Path, required=True)
    parser.add_argument("--traces", default="zipf-longtail,hot-burst,cold-storm")
    parser.add_argument("--trace-requests", type=int, default=192)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from loraplex.artifacts.base_model import BaseModelSpec
    from loraplex.demo.assets import generate_demo_assets

    config = SimBenchConfig(
        traces=tuple(args.traces.split(",")),
        targets=("single",),
        trace_requests=args.trace_requests,
        cost_model=args.cost_model,
        scale=None,
    )
    cost = cost_file.load(args.cost_model)
    assets = generate_demo_assets(config.asset_dir / "test-small", preset="small", seed=0)
    vocab = BaseModelSpec.from_dir(assets.base_model_dir).vocab_size
    workloads = config.workloads()
    report = {}
    with tempfile.TemporaryDirectory(prefix="loraplex-timeline-") as tmp, args.out.open("w") as f:
        root = Path(tmp)
        registry = prepared(config, workloads, root, assets.base_model_dir)
        adapters = [a for w in workloads for a in w.adapters]
        sizes, per_rank = adapter_sizes(registry.model_dir, adapters)
        values = sim_config(config, "single", per_rank, registry_tenants(registry))
        for i, w in enumerate(workloads):
            sims, stamps = simulated_outcomes(
                records(workload_rows(w, MAX_LORA_RANK, sizes)), values, cost
            )
            recs, lines = real_run(registry, w, config, root / f"single-{i}", vocab)
            rows = paired(w, recs, lines, sims, stamps)
            for row in rows:
                f.write(json.dumps({"trace": w.name, **row}) + "\n")
            report[w.name] = summary(rows)
            sys.stdout.write(f"{w.name} {json.dumps(report[w.name], indent=1)}\n")


if __name__ == "__main__":
    main()
