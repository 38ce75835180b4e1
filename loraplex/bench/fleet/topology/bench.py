"""``bench fleet --topology``'s driver: the runs on a real fleet.

The rate is ``load`` times the capacity of the baseline fleet, measured first (``bench fleet``'s
bursts, of the first trace's mix), unless given. Each run deploys a fresh fleet, replays an
unmeasured warm-up of the trace (another seed; the dedication and the merge may happen there),
replays the trace, reads the decisions by reason over the trace alone, then sends greedy probes
(every revision and the base model, one at a time) whose outputs must be identical on every run
of every side; a ``TransitionPoller`` watches the merges meanwhile. Sides run in ABBA order per
repeat (``harness.order.run_order``); figures are medians over the repeats with their [min, max]
and the headline ratios are taken per repeat pair (``report.py``).
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from loraplex.bench.fleet.bench import FleetTarget, deployment_settings
from loraplex.bench.fleet.drive import measure_capacity, median_or_none, replay
from loraplex.bench.fleet.topology.config import (
    MAX_LORA_RANK,
    PROBE_PROMPT_TOKENS,
    PROBE_TOKENS,
    RAY_CPUS,
    SIDES,
    TENANT,
    TOPOLOGY,
    TopologyBenchConfig,
)
from loraplex.bench.fleet.topology.poller import TransitionPoller
from loraplex.bench.fleet.topology.report import SideRun, probe_check, topology_metrics
from loraplex.bench.fleet.topology.traces import hot_token_share, revisions, topology_trace
from loraplex.bench.harness.machine import machine_record
from loraplex.bench.harness.order import run_order
from loraplex.bench.serve.driver import DriveConfig, prompt_ids
from loraplex.bench.serve.fleet import drop_page_cache, prepare_fleet
from loraplex.bench.workloads import TraceRequest


def run_topology_bench(config: TopologyBenchConfig) -> dict[str, Any]:
    """Every run; the result has name, config, seed, metrics (``probes``: the check) and runs."""
    from loraplex.artifacts.base_model import BaseModelSpec
    from loraplex.bench.fleet.cluster import local_cluster
    from loraplex.demo.assets import generate_demo_assets

    assets = generate_demo_assets(config.asset_dir / "test-small", preset="small", seed=0)
    vocab = BaseModelSpec.from_dir(assets.base_model_dir).vocab_size
    drive = DriveConfig(
        request_timeout_s=config.request_timeout_s, vocab_size=vocab, seed=config.seed
    )
    with tempfile.TemporaryDirectory(prefix="loraplex-bench-topology-") as tmp:
        root = Path(tmp)
        registry = prepare_fleet(
            root / "registry", assets.base_model_dir, revisions(), MAX_LORA_RANK, config.seed
        )
        with local_cluster(RAY_CPUS) as port:
            target = FleetTarget(registry, f"http://127.0.0.1:{port}", port, root)
            rate, capacity = _rate(config, target, drive)
            traces = {
                t: topology_trace(t, config.seed, rate, config.trace_requests, config.prompt_tokens)
                for t in config.traces
            }
            runs, order = _side_runs(config, target, traces, rate, drive)
    metrics = topology_metrics(runs, config.traces, config.request_timeout_s)
    metrics["probes"] = probe_check(runs)
    metrics["capacity_rps"] = [round(v, 3) for v in capacity]
    metrics["trace_rate"] = round(rate, 3)
    metrics["hot_token_share"] = {t: hot_token_share(r) for t, r in traces.items()}
    metrics["trace_requests"] = {t: len(r) for t, r in traces.items()}
    metrics["run_order"] = order
    return {
        "name": "fleet-topology",
        "config": {**config.plain(), "machine": machine_record()},
        "seed": config.seed,
        "metrics": metrics,
        "runs": runs,
    }


def _rate(
    config: TopologyBenchConfig, target: FleetTarget, drive: DriveConfig
) -> tuple[float, tuple[float, ...]]:
    """The trace rate (``config.rate``, else ``load`` x the measured capacity) and the capacity
    bursts measured (none when the rate was given)."""
    if config.rate is not None:
        return config.rate, ()
    capacity = _capacity(config, target, drive)
    measured = median_or_none(capacity) or 0.0
    if not measured > 0:
        raise RuntimeError(f"measured capacity {capacity} req/s leaves no rate")
    return config.load * measured, capacity


def _capacity(
    config: TopologyBenchConfig, target: FleetTarget, drive: DriveConfig
) -> tuple[float, ...]:
    """Completed requests per second of bursts of the first trace's mix on the baseline."""
    from loraplex.bench.fleet.cluster import deployed

    settings = deployment_settings(config, target, target.root / "capacity")
    mix = topology_trace(
        config.traces[0], config.seed + 7, 1.0, config.capacity_requests, config.prompt_tokens
    )
    batch = [replace(r, t_s=0.0) for r in mix[: config.capacity_requests]]
    with deployed(settings, target.url, target.registry.admin_key):
        keys = target.registry.keys
        return measure_capacity(target.url, batch, keys, drive, config.capacity_rounds)


def _side_runs(
    config: TopologyBenchConfig,
    target: FleetTarget,
    traces: Mapping[str, tuple[TraceRequest, ...]],
    rate: float,
    drive: DriveConfig,
) -> tuple[list[SideRun], list[str]]:
    runs, names = [], []
    names_of = list(traces)
    for index, (group, member) in enumerate(run_order([len(SIDES)] * len(traces), config.repeats)):
        trace, side = names_of[group], SIDES[member]
        names.append(f"{trace}/{side}")
        run_dir = target.root / f"run-{index}"
        requests = traces[trace]
        run = _side_run(
            config, target, drive, run_dir, trace=trace, requests=requests, side=side, rate=rate
        )
        runs.append(run)
    return runs, names


def _side_run(
    config: TopologyBenchConfig,
    target: FleetTarget,
    drive: DriveConfig,
    run_dir: Path,
    *,
    trace: str,
    requests: tuple[TraceRequest, ...],
    side: str,
    rate: float,
) -> SideRun:
    """One deployment of ``side`` in ``run_dir``: the warm-up, the measured replay of
    ``requests`` (trace ``trace``), the decisions it made and the greedy probes."""
    from loraplex.bench.fleet.cluster import deployed, fleet_state

    admin_key, keys = target.registry.admin_key, target.registry.keys
    settings = deployment_settings(
        config,
        target,
        run_dir,
        mode="auto" if side == TOPOLOGY else "unmerged",  # only these two differ
        topology={} if side == TOPOLOGY else None,
    )
    drop_page_cache(target.registry.store)
    warmup: tuple[TraceRequest, ...] = ()
    if config.warmup_requests:
        warmup = topology_trace(
            trace, config.seed + 1, rate, config.warmup_requests, config.prompt_tokens
        )
    with (
        deployed(settings, target.url, admin_key),
        TransitionPoller(target.url, admin_key) as poller,
    ):
        if warmup:
            asyncio.run(replay(target.url, warmup, keys, replace(drive, seed=drive.seed + 1)))
        before = fleet_state(target.url, admin_key)["decisions"]
        start = time.monotonic()
        records = asyncio.run(replay(target.url, requests, keys, drive))
        wall_s = time.monotonic() - start
        after = fleet_state(target.url, admin_key)["decisions"]
        probes = greedy_probes(target.url, keys[TENANT], drive.vocab_size, config.seed)
    decided = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
    timeline = poller.timeline(start)
    return SideRun(trace, side, requests, tuple(records), wall_s, decided, timeline, probes)


def greedy_probes(url: str, key: str, vocab: int, seed: int) -> dict[str, str]:
    """Each revision's and the base model's greedy continuation of one fixed prompt, one
    request at a time (no batching partner: the output depends on the weights alone)."""
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60.0) as client:
        listed = client.get("/v1/models").json()["data"]
        base = next(m["id"] for m in listed if not m.get("parent"))
        out = {}
        for model in [base, *(a.name for a in revisions())]:
            ids = prompt_ids(random.Random(f"{seed}/{model}"), PROBE_PROMPT_TOKENS, vocab)
            body = {"model": model, "prompt": ids, "max_tokens": PROBE_TOKENS,
                    "temperature": 0, "ignore_eos": True}  # fmt: skip
            reply = client.post("/v1/completions", json=body)
            reply.raise_for_status()
            out["base" if model == base else model] = reply.json()["choices"][0]["text"]
    return out
