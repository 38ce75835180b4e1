"""The engine side of ``loraplex serve``: registry-backed artifact resolution, the adapter runtime
(slot pool + tiered cache), the operators' warm policies and the engine core. It imports torch:
only the engine's child process (``build_worker``, reached through ``serve/worker.py``) and the
thread mode (``start_engine_here``, ``engine_process = false``) import it.

In the child the worker opens its own registry connection (SQLite in WAL mode and PostgreSQL
both serve several processes) for artifact lookups and the warm policies.
"""

from __future__ import annotations

import threading
from pathlib import Path

from loraplex.artifacts.base_model import BaseModelSpec, DigestedCheckpoint
from loraplex.artifacts.identity import AdapterKey
from loraplex.dtypes import DTYPE_BYTES, bytes_per_element
from loraplex.engine.factory import (
    AdapterRuntime,
    AdapterRuntimeConfig,
    build_adapter_runtime,
    build_engine,
    build_engine_core,
)
from loraplex.engine.heap import keep_freed_heap
from loraplex.engine.model_load import load_in_background
from loraplex.engine.transport.thread_client import AsyncEngine
from loraplex.engine.transport.worker import WorkerHandles
from loraplex.errors import DigestMismatchError
from loraplex.registry import Registry, open_registry
from loraplex.residency.warm import AutoWarmConfig
from loraplex.runtime.tier_backends import ArtifactRef
from loraplex.serve import operator_pins
from loraplex.serve.config import ServeConfig
from loraplex.serve.engine_process import prepare_engine_process
from loraplex.serve.engine_settings import (
    engine_config,
    registry_config,
    tenant_settings,
    warm_policies,
    watchdog_policy,
)

ADAPTER_CACHE_DIR = "adapter-cache"
# Disk bytes beyond the tensors: the safetensors header and adapter_config.json.
_FILE_OVERHEAD_BYTES = 64 << 10


class RegistryResolver:
    """AdapterKey -> ArtifactRef from the registry (revisions are immutable: memoised)."""

    def __init__(self, registry: Registry, dtype: str) -> None:
        self._registry = registry
        self._param_bytes = bytes_per_element(dtype)
        self._refs: dict[AdapterKey, ArtifactRef] = {}
        self._lock = threading.Lock()

    def __call__(self, key: AdapterKey) -> ArtifactRef:
        with self._lock:
            cached = self._refs.get(key)
        if cached is not None:
            return cached
        revision = self._registry.get_revision(key.ref)
        if revision.adapter_digest != key.adapter_digest:
            raise DigestMismatchError(
                f"{key.ref} in the registry", key.adapter_digest, revision.adapter_digest
            )
        signed = revision.provenance
        stored_param_bytes = DTYPE_BYTES.get(revision.dtype, DTYPE_BYTES["float32"])
        memory = revision.estimated_bytes * self._param_bytes // stored_param_bytes
        ref = ArtifactRef(
            config_digest=revision.config_digest,
            weights_digest=revision.adapter_digest,
            disk_bytes=revision.tensor_bytes + _FILE_OVERHEAD_BYTES,
            memory_bytes=memory,
            signature_digest=None if signed is None else signed.signature_digest,
        )
        with self._lock:
            self._refs[key] = ref
        return ref


def build_runtime(config: ServeConfig, base: BaseModelSpec, registry: Registry) -> AdapterRuntime:
    runtime_config = AdapterRuntimeConfig(
        max_loras=config.gpu_slots(base),
        max_lora_rank=config.max_lora_rank,
        cpu_adapter_bytes=config.cpu_bytes(base),
        disk_cache_bytes=config.disk_cache_bytes,
        policy=config.policy,
        dtype=config.dtype,
        device=config.device,
        max_concurrent_loads=config.max_concurrent_loads,
        tenant_max_concurrent_loads=config.tenant_max_concurrent_loads,
        tenants=tenant_settings(registry),
        auto_warm=AutoWarmConfig() if config.auto_warm else None,
        auto_warm_interval_s=config.auto_warm_interval_s,
        max_auto_gpu_slots=config.auto_gpu_slots(base),
        default_tenant_tier_share=config.default_tenant_tier_share,
        tier_share_by_priority=config.tier_share_by_priority,
    )
    resolver = RegistryResolver(registry, config.dtype)
    disk = config.data_dir / ADAPTER_CACHE_DIR
    return build_adapter_runtime(base, resolver, registry.store, disk, runtime_config)


def apply_warm_policies(registry: Registry, runtime: AdapterRuntime, base_digest: str) -> int:
    """Hands every revision's recorded warm policy to the cache (``warm_policies``); returns
    how many."""
    policies = warm_policies(registry, base_digest)
    for key, warm in policies.items():
        runtime.cache.set_warm_policy(key, warm)
    return len(policies)


def apply_standing(registry: Registry, runtime: AdapterRuntime, base_digest: str) -> None:
    """What the registry records for the cache of a server's engine: the warm policies, then the
    operator's pins (``serve/operator_pins.py``), before the engine takes a request."""
    apply_warm_policies(registry, runtime, base_digest)
    operator_pins.apply(registry, runtime.cache, base_digest)


def build_worker(
    config: ServeConfig, model_dir: Path, digested: DigestedCheckpoint | None = None
) -> WorkerHandles:
    """Everything the engine process runs: its registry connection, the adapter runtime (its
        disk copies recovered), the warm policies and the engine core (torch threads set first, and
        the process told to keep the memory its steps free: ``engine.heap``). The checkpoint loads
        on a thread from the start (``engine.model_load``), beside the registry; ``digested``: the
    server's digest of the base model, taken while its files still stat the same."""
    prepare_engine_process(config)
    engine = engine_config(config)
    # beside the registry and runtime below; the load started ahead, if any, when it passes
    loading = load_in_background(model_dir, engine, digested)
    try:
        base = BaseModelSpec.from_dir(model_dir, digested)
        registry = open_registry(registry_config(config), base=base)
    except BaseException:
        loading.wait()
        raise
    try:
        runtime = build_runtime(config, base, registry)
    except BaseException:
        loading.wait()
        registry.close()
        raise
    try:
        apply_standing(registry, runtime, base.digest)
        core = build_engine_core(model_dir, engine, runtime, model=loading.result())
    except BaseException:
        loading.wait()
        runtime.cache.close()
        registry.close()
        raise

    def close() -> None:
        runtime.cache.close()
        registry.close()

    return WorkerHandles(
        core,
        engine.idle_wait_s,
        runtime.pool.max_loras,
        runtime.update_tenant_settings,
        close,
        runtime.merge_holds,
    )


def start_engine_here(
    config: ServeConfig, base: BaseModelSpec, registry: Registry, model_dir: Path
) -> tuple[AsyncEngine, AdapterRuntime]:
    """The engine on a thread of this process (``engine_process = false``) and its runtime, the
    operators' warm policies applied (the runtime's cache closed when either fails); this
    process keeps the memory the engine's steps free (``engine.heap``), as an engine process
    does."""
    keep_freed_heap()
    runtime = build_runtime(config, base, registry)
    try:
        apply_standing(registry, runtime, base.digest)
        watchdog = watchdog_policy(config)
        engine = build_engine(model_dir, engine_config(config), runtime, watchdog=watchdog)
    except BaseException:
        runtime.cache.close()
        raise
    return engine, runtime
