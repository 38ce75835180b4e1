"""``bench sim``'s simulated side: the traces of a run through ``simulate`` with a config
mirroring the real deployment (its settings, the server's defaults where the simulator's
differ, the registry's tenants, each adapter's bytes as served)."""

from __future__ import annotations

import random
import string
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from loraplex.bench.serve.fleet import Fleet
from loraplex.bench.sim.config import SimBenchConfig
from loraplex.bench.sim.interleaved import Pricing
from loraplex.bench.sim.validate import MAX_LORA_RANK
from loraplex.bench.workloads import TraceAdapter, Workload
from loraplex.engine.tenant_shares import TenantSettings
from loraplex.serve.config import ServeConfig

BYTES_PER_PARAM = 4  # the demo server serves float32
# Ray Serve names each replica of a deployment with a fresh random string of this many
# lowercase letters and digits (``ReplicaID.unique_id``); the router's placement hashes it.
RAY_ID_CHARS = string.ascii_lowercase + string.digits
RAY_ID_LENGTH = 8
TIERS = ("L0", "L1", "L2", "L3")
# The server's defaults the real runs keep and the simulator's own defaults differ from.
SERVED_DEFAULTS = {f.name: f.default for f in fields(ServeConfig)}


def sim_config(
    config: SimBenchConfig,
    target: str,
    bytes_per_rank: int,
    tenants: Mapping[str, TenantSettings],
) -> dict[str, Any]:
    """SimConfig fields mirroring the real deployment of ``target``: its settings, the server's
    context length and KV blocks (the simulator's defaults too, named here all the same so
    the mirror holds whatever either default becomes), and ``tenants`` as the
    server's engine reads them from the registry (priority classes, quotas)."""
    s = config.settings
    return {
        "replicas": s.replicas if target == "fleet" else 1,
        "eviction_policy": "cost_aware",
        "max_loras": s.max_loras,
        "max_lora_rank": MAX_LORA_RANK,
        "bytes_per_rank": bytes_per_rank,
        "cpu_adapter_bytes": s.cpu_adapter_bytes,
        "max_num_seqs": s.max_num_seqs,
        "max_model_len": SERVED_DEFAULTS["max_model_len"],
        "num_kv_blocks": SERVED_DEFAULTS["num_kv_blocks"],
        "queue_deadline_s": s.request_timeout_s / 2,
        "timeout_s": s.request_timeout_s,
        "seed": s.seed,
        "tenants": dict(tenants),
    }


def registry_tenants(registry: Fleet) -> dict[str, TenantSettings]:
    """Every tenant's settings as a server on ``registry`` hands them to its engine."""
    from loraplex.registry import RegistryConfig, open_registry
    from loraplex.serve.engine_settings import tenant_settings

    where = RegistryConfig(registry.root, registry.database_url, str(registry.store))
    opened = open_registry(where)
    try:
        return tenant_settings(opened)
    finally:
        opened.close()


def served_keys(registry: Fleet, adapters: list[TraceAdapter]) -> dict[tuple[str, str], Any]:
    """Each trace adapter's key as the real runs' servers resolve it (``tenant/name@r1`` in
    ``registry``: ``bench.serve.fleet.prepare_fleet``), by (tenant, name) as ``simulate``'s
    ``adapter_keys`` take it: the router's name of the revision, which its placement hashes."""
    from loraplex.registry import RegistryConfig, open_registry

    where = RegistryConfig(registry.root, registry.database_url, str(registry.store))
    opened = open_registry(where)
    try:
        return {
            (a.tenant, a.name): opened.get_revision(f"{a.tenant}/{a.name}@r1").key()
            for a in adapters
        }
    finally:
        opened.close()


def adapter_sizes(
    model_dir: Path, adapters: list[TraceAdapter]
) -> tuple[dict[tuple[str, str], int], int]:
    """Each adapter's bytes as served (float32, rank capped) and the slot bytes per rank."""
    from loraplex.artifacts.base_model import TARGET_MODULES, BaseModelSpec, lora_bytes

    spec = BaseModelSpec.from_dir(model_dir)
    sizes = {
        (a.tenant, a.name): lora_bytes(spec, min(a.rank, MAX_LORA_RANK), BYTES_PER_PARAM, a.targets)
        for a in adapters
    }
    return sizes, lora_bytes(spec, 1, BYTES_PER_PARAM, TARGET_MODULES)


def simulated(
    config: SimBenchConfig, workloads: list[Workload], pricing: Pricing, registry: Fleet
) -> dict[str, dict[str, Any]]:
    """target -> trace -> the simulator's metrics, each priced by ``pricing``."""
    from loraplex.bench.sim.traces import workload_rows
    from loraplex.sim.call import records, simulate_metrics

    adapters = [a for w in workloads for a in w.adapters]
    sizes, per_rank = adapter_sizes(registry.model_dir, adapters)
    tenants = registry_tenants(registry)
    keys = served_keys(registry, adapters)
    out: dict[str, dict[str, Any]] = {}
    for target in config.targets:
        values = sim_config(config, target, per_rank, tenants)
        out[target] = {}
        for w in workloads:
            trace = records(workload_rows(w, MAX_LORA_RANK, sizes))
            model = pricing(target, w.name)
            # the served keys and the simulator's rank names: the real fleet's placement
            metrics = simulate_metrics(trace, values, model, adapter_keys=keys)
            if target == "fleet" and config.fleet_id_draws:
                drawn = id_drawn_hit_ratios(
                    trace, values, model, config.fleet_id_draws, config.seed, adapter_keys=keys
                )
                metrics["hit_ratio_own_ids"] = metrics["hit_ratio"]
                metrics["hit_ratio"] = drawn.pop("mean")
                metrics["hit_ratio_id_draws"] = drawn
            out[target][w.name] = metrics
    return out


def ray_like_ids(rng: random.Random, replicas: int) -> list[str]:
    """``replicas`` distinct ids drawn as Ray Serve draws a deployment's replica ids."""
    ids: list[str] = []
    while len(ids) < replicas:
        drawn = "".join(rng.choice(RAY_ID_CHARS) for _ in range(RAY_ID_LENGTH))
        if drawn not in ids:
            ids.append(drawn)
    return ids


def id_drawn_hit_ratios(
    trace: list[Any],
    values: Mapping[str, Any],
    pricing: Any,
    draws: int,
    seed: int,
    *,
    adapter_keys: Mapping[tuple[str, str], Any] | None = None,
) -> dict[str, Any]:
    """The fleet's hit ratio per tier over ``draws`` simulations of ``trace``, each with its
    replicas named by a fresh draw of Ray-like ids (``ray_like_ids``, from ``seed``): the
    router of a fleet before 2026-12-06 placed cold revisions by a hash of its replicas' random
    ids, which Ray draws afresh for every deployment, so one naming was one sample of the
    partition (docs/simulator.md, "simfleet"; a fleet now places by rank: "simrank"). The mean
    (``mean``, what the real runs are compared with), ``min``, ``max`` per tier and ``draws``."""
    from loraplex.sim.call import simulate_metrics

    rng = random.Random(f"replica-ids-{seed}")
    ratios = [
        simulate_metrics(
            trace, values, pricing, ray_like_ids(rng, values["replicas"]), adapter_keys
        )["hit_ratio"]
        for _ in range(draws)
    ]
    out: dict[str, Any] = {"draws": draws}
    for name, pick in (("mean", None), ("min", min), ("max", max)):
        out[name] = {
            t: round(sum(r[t] for r in ratios) / draws, 4) if pick is None
            else pick(r[t] for r in ratios)
            for t in TIERS
        }  # fmt: skip
    return out
