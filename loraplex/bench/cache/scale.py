"""``loraplex bench cache --scale``: what the cache costs as a function of how much it holds.

At each size N (default 100, 1,000 and 10,000 cached copies of tiny synthetic adapters,
``bench/synthetic.py``) one run measures, through public entry points only:

- start-up recovery: ``build_adapter_runtime`` over an L2 directory holding the N copies
  (verification of every file plus adoption into the ledger), as seconds per 1,000 copies;
- per-load placement: ``acquire_future -> lease`` end to end (perf_counter around the future,
  the real threaded executor and tier pipeline) for adapters that are only in the artifact
  store, first while L2 has free room, then with L2 full so each load must evict a copy;
- idle engine CPU: the real server (``serve.assembly.build_server``: ``EngineProcess`` child +
  ``create_app``) recovering the N copies, then left idle; CPU seconds per wall second of the
  engine child from ``/proc/<pid>/stat`` (and of this, the HTTP process, beside it);
- ``GET /metrics`` on that server's app (in-process ASGI client), median of K.

A server whose engine does not start within its start timeout (recovery of N copies is part of
the start) leaves its four numbers null.

Headline metrics are ratios of the largest size over the smallest (``*_10k_over_100`` with the
default sizes); a ratio whose denominator measured nothing is null, never 0.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.numpy import load

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.identity import AdapterKey, sha256_file
from loraplex.artifacts.manifest import CONFIG_FILE
from loraplex.artifacts.store import LocalArtifactStore
from loraplex.artifacts.validate import WEIGHTS_FILE, validate_adapter_dir
from loraplex.bench.harness.stats import ratio
from loraplex.bench.synthetic import RANK, SyntheticAdapter, SyntheticAdapters
from loraplex.engine.factory import AdapterRuntimeConfig, build_adapter_runtime
from loraplex.errors import EngineUnavailableError
from loraplex.residency.ledger import Tier
from loraplex.runtime.tier_backends import ArtifactRef, DiskTier

CACHE_DIR = "adapter-cache"  # serve.engine_side.ADAPTER_CACHE_DIR: where the server's L2 lives
_WARMUP_LOADS = 2  # untimed loads first (first-touch costs of the pipeline and slot pool)
_SETTLE_S = 1.0  # after the server is up, before the idle window opens


@dataclass(frozen=True)
class ScaleBenchConfig:
    """What one scale run measures."""

    sizes: tuple[int, ...] = (100, 1000, 10_000)  # cached copies per measurement
    loads: int = 16  # timed placements per variant (free room, eviction)
    metrics_requests: int = 20  # GET /metrics per size (median)
    idle_window_s: float = 5.0  # wall seconds of the idle CPU measurement
    seed: int = 0  # synthetic adapter weights
    asset_dir: Path = Path(".loraplex-assets")  # the demo base model is <dir>/test-small

    def __post_init__(self) -> None:
        if len(self.sizes) < 2 or any(n < 1 for n in self.sizes):
            raise ValueError(f"sizes {self.sizes} is invalid; expected >= 2 sizes, each >= 1")
        for name in ("loads", "metrics_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")
        if not self.idle_window_s > 0:
            raise ValueError(f"idle_window_s {self.idle_window_s} is invalid; expected > 0")


def run_scale_bench(config: ScaleBenchConfig) -> dict[str, Any]:
    from loraplex.demo.assets import generate_demo_assets

    assets = generate_demo_assets(config.asset_dir / "test-small", preset="small", seed=0)
    model_dir = assets.base_model_dir
    base = BaseModelSpec.from_dir(model_dir)
    synthetic = SyntheticAdapters(base, config.seed)
    per_size: dict[int, dict[str, float | None]] = {}
    with tempfile.TemporaryDirectory(prefix="loraplex-scale-") as tmp:
        for size in sorted(config.sizes):
            work = Path(tmp) / str(size)
            fill_disk_tier(work / "data" / CACHE_DIR, base, synthetic, size)
            row = _measure_server(config, work / "data", model_dir)
            row.update(_measure_runtime(config, work, base, synthetic, size))
            per_size[size] = row
            shutil.rmtree(work, ignore_errors=True)
    return _result(config, per_size)


def fill_disk_tier(
    root: Path, base: BaseModelSpec, synthetic: SyntheticAdapters, count: int
) -> list[SyntheticAdapter]:
    """``count`` verified copies in an L2 directory, committed the way a load commits them."""
    disk = DiskTier(root)
    made = []
    for index in range(count):
        adapter = synthetic.adapter(index)
        staged = adapter.write(disk.quarantine_dir())
        disk.commit(adapter.key, staged, validate_adapter_dir(staged, base, RANK))
        made.append(adapter)
    return made


# --- the real server: idle engine CPU and /metrics ------------------------------------------


def _measure_server(config: ScaleBenchConfig, data_dir: Path, model_dir: Path) -> dict[str, Any]:
    from fastapi.testclient import TestClient

    from loraplex.serve.assembly import build_server
    from loraplex.serve.config import ServeConfig

    serve_config = ServeConfig(
        data_dir=data_dir,
        model=model_dir,
        demo=False,
        admin_key="scale-bench-admin",
        max_loras=4,
        max_lora_rank=RANK,
        disk_cache_bytes=1 << 40,
        torch_threads=1,
        engine_process=True,
    )
    started = time.perf_counter()
    try:
        server = build_server(serve_config)
    except EngineUnavailableError:
        # NOTE: the engine child recovers every copy before it answers; past the start timeout
        # the server never comes up, and what it would have measured is unknown (null).
        return dict.fromkeys(("engine_start_s", "idle_cpu_engine", "idle_cpu_server", "metrics_ms"))
    try:
        start_s = time.perf_counter() - started
        pid = getattr(server.engine, "pid", None)
        if pid is None:
            raise RuntimeError("the engine runs in this process; expected an EngineProcess child")
        time.sleep(_SETTLE_S)
        engine_cpu, server_cpu = _idle_cpu(pid, config.idle_window_s)
        headers = {"Authorization": f"Bearer {serve_config.admin_key}"}
        with TestClient(server.app) as client:
            metrics_s = _median_of(config.metrics_requests, lambda: _get(client, headers))
    finally:
        server.close()
    return {
        "engine_start_s": start_s,
        "idle_cpu_engine": engine_cpu,
        "idle_cpu_server": server_cpu,
        "metrics_ms": 1000 * metrics_s,
    }


def _get(client: Any, headers: dict[str, str]) -> None:
    response = client.get("/metrics", headers=headers)
    if response.status_code != 200:
        raise RuntimeError(f"GET /metrics answered {response.status_code}; expected 200")


def _idle_cpu(pid: int, window_s: float) -> tuple[float, float]:
    """CPU seconds per wall second over ``window_s``: the child ``pid``, and this process."""
    child_before, own_before = _process_cpu_s(pid), time.process_time()
    wall_before = time.perf_counter()
    time.sleep(window_s)
    wall_s = time.perf_counter() - wall_before
    child_s = _process_cpu_s(pid) - child_before
    return child_s / wall_s, (time.process_time() - own_before) / wall_s


def _process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (all its threads), from /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # the name may hold spaces; skip past it
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


# --- the adapter runtime: recovery and per-load placement --------------------------------------


def _measure_runtime(
    config: ScaleBenchConfig, work: Path, base: BaseModelSpec, synthetic: SyntheticAdapters, n: int
) -> dict[str, Any]:
    store = LocalArtifactStore(work / "store")
    count = _WARMUP_LOADS + 2 * config.loads
    fresh = [synthetic.adapter(n + i, tenant_prefix="new") for i in range(count)]
    refs = {a.key: _publish(store, work / "staging", a) for a in fresh}
    copy_bytes = fresh[0].size_bytes
    # Room for the N recovered copies and the untimed + free-room loads: the eviction loads
    # that follow each find L2 full.
    room = n + _WARMUP_LOADS + config.loads
    runtime_config = AdapterRuntimeConfig(
        max_loras=4, max_lora_rank=RANK, disk_cache_bytes=room * copy_bytes
    )
    started = time.perf_counter()
    runtime = build_adapter_runtime(
        base, refs.__getitem__, store, work / "data" / CACHE_DIR, runtime_config
    )
    recover_s = time.perf_counter() - started
    try:
        recovered = len(runtime.cache.residency(Tier.L2))
        if recovered != n:
            raise RuntimeError(f"recovered {recovered} copies; expected {n}")
        place = [_place_s(runtime.cache, a.key) for a in fresh]
    finally:
        runtime.cache.close()
    free = place[_WARMUP_LOADS : _WARMUP_LOADS + config.loads]
    evicting = place[_WARMUP_LOADS + config.loads :]
    return {
        "recover_s": recover_s,
        "recover_s_per_1k_copies": 1000 * recover_s / n,
        "place_free_room_ms": 1000 * statistics.median(free),
        "place_eviction_ms": 1000 * statistics.median(evicting),
    }


def _publish(store: LocalArtifactStore, staging: Path, adapter: SyntheticAdapter) -> ArtifactRef:
    """Puts ``adapter``'s files in the artifact store (L3) and returns the record a resolver
    hands the pipeline for it."""
    folder = adapter.write(staging / adapter.key.name)
    config_digest = sha256_file(folder / CONFIG_FILE)
    store.put_file(folder / CONFIG_FILE, config_digest)
    store.put_file(folder / WEIGHTS_FILE, adapter.key.adapter_digest)
    memory = sum(t.nbytes for t in load(adapter.weights).values())
    return ArtifactRef(config_digest, adapter.key.adapter_digest, adapter.size_bytes, memory)


def _place_s(cache: Any, key: AdapterKey) -> float:
    """Seconds from ``acquire_future`` to the lease (the load walks L3 -> L2 -> L1 -> L0)."""
    started = time.perf_counter()
    lease = cache.acquire_future(key).result(timeout=120)
    elapsed = time.perf_counter() - started
    lease.release()
    return elapsed


def _median_of(count: int, call: Callable[[], None]) -> float:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


# --- result ------------------------------------------------------------------------------------


def size_label(n: int) -> str:
    """100 -> "100", 1000 -> "1k", 10000 -> "10k" (the metric names' spelling)."""
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


def _result(config: ScaleBenchConfig, per_size: dict[int, dict[str, Any]]) -> dict[str, Any]:
    small, large = min(per_size), max(per_size)
    growth = f"{size_label(large)}_over_{size_label(small)}"

    def grow(field: str) -> float | None:
        return ratio(per_size[large][field], per_size[small][field], None)

    free, evicting = grow("place_free_room_ms"), grow("place_eviction_ms")
    known = [r for r in (free, evicting) if r is not None]
    metrics: dict[str, float | None] = {
        f"place_cost_{growth}": max(known) if known else None,
        f"place_cost_free_room_{growth}": free,
        f"place_cost_eviction_{growth}": evicting,
        f"idle_cpu_{growth}": grow("idle_cpu_engine"),
        f"metrics_latency_{growth}": grow("metrics_ms"),
        "recover_s_per_1k_copies": per_size[large]["recover_s_per_1k_copies"],
        f"recover_s_per_1k_copies_{growth}": grow("recover_s_per_1k_copies"),
    }
    for n, row in per_size.items():
        metrics[f"recover_s_per_1k_copies_{size_label(n)}"] = row["recover_s_per_1k_copies"]
    return {
        "name": "cache-scale",
        "config": {
            "sizes": sorted(per_size),
            "loads": config.loads,
            "metrics_requests": config.metrics_requests,
            "idle_window_s": config.idle_window_s,
        },
        "seed": config.seed,
        "metrics": {k: _rounded(v) for k, v in metrics.items()},
        "per_size": {
            size_label(n): {k: _rounded(v) for k, v in row.items()} for n, row in per_size.items()
        },
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.4g}")
