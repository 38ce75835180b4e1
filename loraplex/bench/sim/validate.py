"""The real side of the validation: the traces replayed on a real single server (``bench serve``'s
machinery: a registry with every trace adapter, a fresh ``loraplex serve`` per trace) and on a
real fleet (``bench fleet``'s: a local Ray cluster, a fresh deployment per trace, the
affinity-until-saturated router), each reduced to the outcome keys ``compare.OUTCOME_KEYS``.

Both sides start cold (no warm-up: the simulator starts with empty caches too) and see the same
requests. TTFT counts every request (failures at the timeout) but those the server refused
before queueing them (a 400 reply: ``refused``, by its error body's ``code``, as the simulator
keys the same requests it refuses at arrival, ``sim/refusal.py``, and leaves out of its
percentiles too; a 400 without a code is keyed ``"400"``); the
makespan runs from the first arrival to the last end (a completed request ends at TTFT + TPOT x
(tokens - 1), a failed or refused one at its reply or the timeout), as ``sim/result.py``
measures it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from loraplex.bench.fleet.report import ttft_ms
from loraplex.bench.harness.stats import ratio
from loraplex.bench.serve.driver import DriveConfig, RequestRecord
from loraplex.bench.serve.fleet import Fleet, ServerOptions, drop_page_cache
from loraplex.bench.serve.summary import hit_ratios
from loraplex.bench.workloads import Workload

MAX_LORA_RANK = 64  # the largest S2 rank; WIDE ranks above it are served capped


@dataclass(frozen=True)
class RealSettings:
    """The deployment both sides run (the simulator's config mirrors these)."""

    max_loras: int = 4  # GPU slots per server / replica
    cpu_adapter_bytes: int = 64 << 20  # L1 budget per server / replica
    replicas: int = 3  # fleet engine replicas
    max_num_seqs: int = 32  # sequences decoding at once
    request_timeout_s: float = 30.0  # client bound; failures count at it
    torch_threads: int = 1  # per server / replica
    seed: int = 0  # prompts and the router's choices

    def __post_init__(self) -> None:
        for name in ("max_loras", "cpu_adapter_bytes", "replicas", "max_num_seqs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")
        if not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s {self.request_timeout_s} is invalid; expected > 0")

    def options(self) -> ServerOptions:
        return ServerOptions(
            "cost_aware",
            self.max_loras,
            self.cpu_adapter_bytes,
            max_num_seqs=self.max_num_seqs,
            queue_deadline_s=self.request_timeout_s / 2,
            torch_threads=self.torch_threads,
        )


def _end_s(record: RequestRecord, timeout_s: float) -> float:
    if record.ok and record.ttft_s is not None:
        decode = (record.tpot_s or 0.0) * max(record.completion_tokens - 1, 0)
        return record.t_s + record.ttft_s + decode
    return record.t_s + (record.reply_s if record.reply_s is not None else timeout_s)


# The status of a request the server refused before queueing it: it can never be served as
# sent (``server/errors.py``), so no TTFT is measured; load failures are 429, 503 or no reply.
REFUSED_STATUS = 400


def request_outcome(records: Sequence[RequestRecord], timeout_s: float) -> dict[str, Any]:
    """TTFT, completion and throughput figures of one replay (sim/result.py's names); a 400
    reply counts in ``requests`` and ``refused`` (by its error code, as the simulator's) and in
    no TTFT percentile (module docstring). NOTE: ``refused`` was keyed by the status
    (``{"400": 2}``) beside the simulator's ``{"context_length_exceeded": 2}``: one JSON line
    held two keys for the same requests."""
    done = sum(r.ok for r in records)
    start = min((r.t_s for r in records), default=0.0)
    makespan = max((_end_s(r, timeout_s) for r in records), default=start) - start
    timed = [r for r in records if r.status != REFUSED_STATUS]
    refused = Counter(r.code or str(r.status) for r in records if r.status == REFUSED_STATUS)
    return {
        "requests": len(records),
        "completed": done,
        "completed_ratio": ratio(done, len(records), 4),
        "ttft_ms": ttft_ms(timed, timeout_s),
        # Diagnostics beside the simulator's (not errors): by the adapter's tier at arrival as
        # the client saw it, where the simulator splits by its lease's tier.
        "ttft_ms_warm": ttft_ms([r for r in timed if r.tier == "L0"], timeout_s),
        "ttft_ms_cold": ttft_ms([r for r in timed if r.tier != "L0"], timeout_s),
        "makespan_s": round(makespan, 4),
        "throughput_requests_per_s": ratio(done, makespan, 3),
        "refused": dict(sorted(refused.items())),
    }


def cache_outcome(hits: dict[str, int], misses: int, l0_loads: int) -> dict[str, Any]:
    """Hit ratios per tier (L3: misses) and the fills of GPU slots."""
    stats: dict[str, object] = {"hits": hits, "misses": misses}
    return {"hit_ratio": hit_ratios(stats), "l0_loads": l0_loads}


@dataclass(frozen=True)
class RunLogs:
    """Where one real single-server run keeps its per-request records (``bench sim
    --logs-dir``), so its requests can be set beside the simulator's one by one."""

    server: Path  # the server's request log (``request_log_path``: the engine's timelines)
    client: Path  # the client's records, one JSON object per request in trace order

    @classmethod
    def under(cls, directory: Path, stem: str) -> RunLogs:
        return cls(directory / f"{stem}.requests.jsonl", directory / f"{stem}.client.jsonl")


def write_client_records(path: Path, records: Sequence[RequestRecord]) -> None:
    """``records`` as JSONL (``RequestRecord``'s fields; ``t_s`` the scheduled arrival in
    seconds from the replay's start, ``ttft_s`` from it to the first token the client read)."""
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(asdict(record), sort_keys=True) + "\n")


def single_outcome(
    registry: Fleet,
    workload: Workload,
    settings: RealSettings,
    drive: DriveConfig,
    root: Path,
    *,
    logs: RunLogs | None = None,
) -> dict[str, Any]:
    """``workload`` on a fresh real server; with ``logs``, the server's request log on and the
    client's records kept (the request log asks the engine for its stages: a few clock reads
    per step and request)."""
    from loraplex.bench.serve.driver import replay_over_http
    from loraplex.bench.serve.fleet import serving

    options = settings.options()
    if logs is not None:
        options = replace(options, request_log_path=logs.server)
    drop_page_cache(registry.store)
    with serving(registry, root, options) as url:
        records, view = asyncio.run(
            replay_over_http(url, workload.requests, registry.keys, registry.admin_key, drive)
        )
    if logs is not None:
        write_client_records(logs.client, records)
    stats = view.final
    raw_hits = stats.get("hits")
    hits = {str(k): int(v) for k, v in raw_hits.items()} if isinstance(raw_hits, dict) else {}
    loads = stats.get("loads")
    l0 = int(loads.get("L0", 0)) if isinstance(loads, dict) else 0
    misses = stats.get("misses", 0)
    out = request_outcome(records, settings.request_timeout_s)
    out.update(cache_outcome(hits, int(misses) if isinstance(misses, int) else 0, l0))
    return out


def fleet_cache_outcome(statuses: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Replica board statuses (``EngineReplica.status()``) summed into the cache outcome."""
    from loraplex.residency.ledger import Tier

    hits = {"L0": 0, "L1": 0, "L2": 0}
    misses = l0_loads = 0
    for status in statuses:
        for tier in hits:
            hits[tier] += int(status["hits"][tier.lower()])
        misses += int(status["hits"]["miss"])
        l0_loads += int(status["summary"].stats.loads.get(Tier.L0, 0))
    return cache_outcome(hits, misses, l0_loads)


def fleet_settings(registry: Fleet, settings: RealSettings, root: Path, port: int) -> Any:
    """The ``FleetSettings`` of a fleet on ``registry`` with ``settings``, the default router."""
    from loraplex.bench.serve.fleet import serve_values
    from loraplex.fleet.settings import FleetSettings
    from loraplex.router.router import DEFAULT_POLICY
    from loraplex.serve.config import merge

    values = serve_values(registry, root, settings.options(), port)
    return FleetSettings(
        serve=merge({}, values),
        model_dir=registry.model_dir,
        engine_replicas=settings.replicas,
        policy=DEFAULT_POLICY,
        seed=settings.seed,
    )


def fleet_outcome(
    target: tuple[Fleet, str, int], workload: Workload, settings: RealSettings,
    drive: DriveConfig, root: Path, *, client_log: Path | None = None,
) -> dict[str, Any]:  # fmt: skip
    """``workload`` on a fresh real fleet; ``target`` is (registry, ingress URL, its port). With
    ``client_log``, the client's records are kept there (``write_client_records``: the tier each
    request's replica reported at its arrival, its TTFT); the fleet's replicas keep no request
    log (``request_log_path`` is the single server's)."""
    from loraplex.bench.fleet.cluster import board_entries, deployed, fleet_state, settled_counters
    from loraplex.bench.fleet.drive import replay

    registry, url, port = target
    drop_page_cache(registry.store)
    with deployed(fleet_settings(registry, settings, root, port), url, registry.admin_key):
        records = asyncio.run(replay(url, workload.requests, registry.keys, drive))
        if client_log is not None:
            write_client_records(client_log, records)
        settled_counters(settings.replicas, time.monotonic())  # every replica reported since
        statuses = [e.status for e in board_entries()]
        decisions = fleet_state(url, registry.admin_key)["decisions"]
    out = request_outcome(records, settings.request_timeout_s)
    out.update(fleet_cache_outcome(statuses))
    out["decisions"] = {k: int(v) for k, v in sorted(decisions.items()) if v}
    return out
