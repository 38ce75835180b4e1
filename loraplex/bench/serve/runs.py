"""The trace runs of ``loraplex bench serve``: which runs are compared, in which order, and
their repeats pooled into one result per run.

Each comparison (one trace, several server settings) runs ``repeats`` times with the order
alternating (ABBA; consecutive comparisons start on alternate sides), on a fresh server and
data directory per run, after the artifact store's pages are dropped from the OS page cache
(``drop_page_cache``): no run reads L3 objects from pages an earlier run warmed.

With ``logs_dir`` each run keeps its server's request log (``request_log_path``: the engine's
stages of every request) and the client's records, as ``run<index>-<run name>.requests.jsonl``
and ``.client.jsonl`` (``bench sim``'s ``RunLogs`` format; the index is the run's place in the
ABBA order, so repeats never share a file).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from loraplex.bench.harness.order import run_order
from loraplex.bench.serve.driver import DriveConfig, RequestRecord, ResidencyView, replay_over_http
from loraplex.bench.serve.fleet import Fleet, ServerOptions, drop_page_cache, serving
from loraplex.bench.serve.summary import (
    HOT_BURST_BASELINES,
    HOT_BURST_CANDIDATES,
    RunResult,
    hot_burst_policies,
    hot_burst_run,
)
from loraplex.bench.sim.validate import RunLogs, write_client_records
from loraplex.bench.workloads import HOT_BURST_WINDOW, Workload

# One run of a comparison: its name, the trace it replays and the server settings.
Run = tuple[str, Workload, ServerOptions]


@dataclass(frozen=True)
class TracePlan:
    """What the trace runs of one invocation are."""

    groups: list[list[Run]]  # comparisons: the runs of one group replay one trace
    repeats: int  # runs of each comparison, order alternating
    timeout_s: float  # the client's bound on a request (failures count at it)
    # where each run keeps its server's request log and the client's records; None: nowhere
    logs_dir: Path | None = None


def comparisons(
    workloads: dict[str, Workload],
    hot_burst_slots: Sequence[int],
    max_loras: int,
    options: Callable[[str, int], ServerOptions],
    candidates: tuple[str, ...] = HOT_BURST_CANDIDATES,
    *,
    baselines: tuple[str, ...] = HOT_BURST_BASELINES,
) -> list[list[Run]]:
    """The groups of runs compared with each other (one trace each), as (name, trace, options)."""
    groups: list[list[Run]] = []
    for name, workload in workloads.items():
        if name == "cold-storm":
            kept = tuple(r for r in workload.requests if r.tenant != "storm")
            quiet = Workload(
                workload.name, workload.seed, workload.duration_s, workload.adapters, kept
            )
            calm = options("cost_aware", max_loras)
            groups.append([(f"{name}/storm", workload, calm), (f"{name}/no-storm", quiet, calm)])
        elif name == "hot-burst":
            for slots in hot_burst_slots:
                groups.append(
                    [
                        (hot_burst_run(slots, policy), workload, options(policy, slots))
                        for policy in hot_burst_policies(candidates, baselines)
                    ]
                )
        else:
            groups.append(
                [
                    (f"{name}/{policy}", workload, options(policy, max_loras))
                    for policy in ("lru", "cost_aware")
                ]
            )
    return groups


def trace_runs(plan: TracePlan, fleet: Fleet, drive: DriveConfig, root: Path) -> list[RunResult]:
    """Every run of ``plan`` in ``run_order``; one result per run name, repeats pooled."""
    groups = plan.groups
    parts: dict[str, list[tuple[list[RequestRecord], ResidencyView]]] = {}
    order = run_order([len(group) for group in groups], plan.repeats)
    for index, (group, member) in enumerate(order):
        run_name, workload, options = groups[group][member]
        logs = None if plan.logs_dir is None else run_logs(plan.logs_dir, index, run_name)
        if logs is not None:
            options = replace(options, request_log_path=logs.server)
        drop_page_cache(fleet.store)
        with serving(fleet, root / f"run-{index}", options) as url:
            part = asyncio.run(
                replay_over_http(url, workload.requests, fleet.keys, fleet.admin_key, drive)
            )
        if logs is not None:
            write_client_records(logs.client, part[0])
        parts.setdefault(run_name, []).append(part)
    runs = []
    for members in groups:
        for run_name, workload, _ in members:
            burst = (
                HOT_BURST_WINDOW[0] * workload.duration_s if workload.name == "hot-burst" else None
            )
            records = tuple(r for records, _ in parts[run_name] for r in records)
            view = pooled_view([view for _, view in parts[run_name]])
            repeats = tuple(
                RunResult(run_name, tuple(part), part_view, plan.timeout_s, burst)
                for part, part_view in parts[run_name]
            )
            runs.append(RunResult(run_name, records, view, plan.timeout_s, burst, repeats))
    return runs


def run_logs(directory: Path, index: int, run_name: str) -> RunLogs:
    """Where the run at ``index`` of the order keeps its logs (``hot-burst@9/lru`` at index 3:
    ``run03-hot-burst@9-lru``)."""
    return RunLogs.under(directory, f"run{index:02d}-{run_name.replace('/', '-')}")


_COUNTERS = ("hits", "misses", "evictions", "reloads_after_eviction")


def pooled_view(views: list[ResidencyView]) -> ResidencyView:
    """The repeats of one run as one view: their cache counters summed (hit ratios then weigh
    every acquire alike); tiers and the hit series of the first (the hit-ratio plot reads each
    repeat's own, ``RunResult.repeats``)."""
    first = views[0]
    final: dict[str, object] = dict(first.final)
    for view in views[1:]:
        for name in _COUNTERS:
            final[name] = _summed(final.get(name), view.final.get(name))
    return ResidencyView(dict(first.tiers), list(first.hit_series), final)


def _summed(a: object, b: object) -> object:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _summed(a.get(k, 0), b.get(k, 0)) for k in sorted({*a, *b}, key=str)}
    return a if b is None else b if a is None else a
