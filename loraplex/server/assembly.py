"""Build a whole server for ``loraplex serve``: registry, adapter cache, engine, app.

Order matters: the registry first (the cache resolves artifacts through it), then the adapter
runtime (slot pool, tier pipeline, cache; ``recover()`` adopts the verified disk copies of the
previous run), the operators' warm policies, and the engine last (it loads the model and starts
its thread). ``Server.close()`` undoes it in reverse.

Tenants' priority classes and quotas reach the cache and the engine through
``tenant_settings(registry)``; the admin API calls ``app.state.refresh_tenants()`` after it
creates or changes a tenant, so the change applies without a restart.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI

from loraplex.adapters.base_model import BaseModelSpec
from loraplex.adapters.identity import AdapterKey
from loraplex.adapters.tiers import ArtifactRef
from loraplex.adapters.warm import WarmPolicy as CacheWarmPolicy
from loraplex.demo.manifest import DemoAssets
from loraplex.engine.config import EngineConfig, SchedulerConfig
from loraplex.engine.engine import AsyncEngine
from loraplex.engine.factory import AdapterRuntime, AdapterRuntimeConfig, build_adapter_runtime
from loraplex.engine.tenancy import TenantSettings
from loraplex.errors import DigestMismatchError
from loraplex.registry import Registry, RegistryConfig, Tenant, WarmPolicy, open_registry
from loraplex.server.app import create_app
from loraplex.server.bootstrap import admin_key, register_demo, sample_keys
from loraplex.server.chat import ChatTemplate
from loraplex.server.deps import ServerConfig, ServerDeps
from loraplex.server.serve_config import ServeConfig

DEMO_DIR = "demo-assets"
ADAPTER_CACHE_DIR = "adapter-cache"
# Disk bytes beyond the tensors: the safetensors header and adapter_config.json.
_FILE_OVERHEAD_BYTES = 64 << 10
_PARAM_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class Server:
    """A built server: the app and what must be closed after it stops."""

    app: FastAPI  # the ASGI application
    deps: ServerDeps  # what the app was built from
    engine: AsyncEngine  # the running engine
    runtime: AdapterRuntime  # slot pool and adapter cache
    registry: Registry  # control plane
    admin_key: str  # the admin credential
    sample_keys: dict[str, str] = field(default_factory=dict)  # demo tenant -> API key

    def close(self) -> None:
        self.engine.shutdown()
        self.runtime.cache.close()
        self.registry.close()


class RegistryResolver:
    """AdapterKey -> ArtifactRef from the registry (revisions are immutable: memoised)."""

    def __init__(self, registry: Registry, dtype: str) -> None:
        self._registry = registry
        self._param_bytes = _PARAM_BYTES[dtype]
        self._refs: dict[AdapterKey, ArtifactRef] = {}
        self._lock = threading.Lock()

    def __call__(self, key: AdapterKey) -> ArtifactRef:
        with self._lock:
            cached = self._refs.get(key)
        if cached is not None:
            return cached
        revision = self._registry.get_revision(key.ref)
        if revision.adapter_digest != key.adapter_digest:
            raise DigestMismatchError(f"{key.ref} in the registry", key.adapter_digest,
                                      revision.adapter_digest)  # fmt: skip
        stored_param_bytes = _PARAM_BYTES.get(revision.dtype, 4)
        memory = revision.estimated_bytes * self._param_bytes // stored_param_bytes
        ref = ArtifactRef(
            config_digest=revision.config_digest,
            weights_digest=revision.adapter_digest,
            disk_bytes=revision.tensor_bytes + _FILE_OVERHEAD_BYTES,
            memory_bytes=memory,
        )
        with self._lock:
            self._refs[key] = ref
        return ref


def _demo_assets(config: ServeConfig) -> DemoAssets | None:
    """The generated demo set when no model is configured (generation imports torch)."""
    if config.model is not None:
        return None
    from loraplex.demo.assets import generate_demo_assets

    return generate_demo_assets(config.data_dir / DEMO_DIR, preset="small", seed=0)


def settings_of(tenant: Tenant) -> TenantSettings:
    """What the engine and the cache enforce for one registry tenant."""
    quotas = tenant.quotas
    return TenantSettings.for_priority(
        tenant.priority.value,
        max_gpu_bytes=quotas.max_gpu_bytes,
        max_cpu_bytes=quotas.max_cpu_bytes,
        max_disk_bytes=quotas.max_disk_bytes,
        max_cold_loads=quotas.max_cold_loads,
    )


def tenant_settings(registry: Registry) -> dict[str, TenantSettings]:
    """Every registry tenant's settings (tenant name -> settings)."""
    return {t.name: settings_of(t) for t in registry.list_tenants()}


class TenantRefresher:
    """Re-reads the registry's tenants into a runtime (the admin API's hook)."""

    def __init__(self, registry: Registry, runtime: AdapterRuntime) -> None:
        self._registry = registry
        self._runtime = runtime
        self._lock = threading.Lock()  # two admin calls must not apply out of order

    def __call__(self) -> None:
        with self._lock:
            self._runtime.update_tenant_settings(tenant_settings(self._registry))


def _runtime(config: ServeConfig, base: BaseModelSpec, registry: Registry) -> AdapterRuntime:
    runtime_config = AdapterRuntimeConfig(
        max_loras=config.gpu_slots(base),
        max_lora_rank=config.max_lora_rank,
        cpu_adapter_bytes=config.cpu_bytes(base),
        disk_cache_bytes=config.disk_cache_bytes,
        policy=config.policy,
        dtype=config.dtype,
        device=config.device,
        tenants=tenant_settings(registry),
    )
    resolver = RegistryResolver(registry, config.dtype)
    disk = config.data_dir / ADAPTER_CACHE_DIR
    return build_adapter_runtime(base, resolver, registry.store, disk, runtime_config)


def apply_warm_policies(registry: Registry, runtime: AdapterRuntime, base_digest: str) -> int:
    """Hands every revision's non-default warm policy to the cache; returns how many."""
    applied = 0
    for adapter in registry.list_adapters():
        for revision in registry.list_revisions(adapter.tenant, adapter.name):
            if revision.warm_policy is WarmPolicy.ON_DEMAND or revision.base_digest != base_digest:
                continue
            warm = CacheWarmPolicy(revision.warm_policy.value)
            runtime.cache.set_warm_policy(revision.key(), warm)
            applied += 1
    return applied


def _engine_config(config: ServeConfig) -> EngineConfig:
    scheduler = SchedulerConfig(
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=max(512, config.max_num_seqs),
        max_model_len=config.max_model_len,
        default_deadline_s=config.queue_deadline_s,
        max_queue_len=config.max_queue_len,
    )
    return EngineConfig(
        scheduler=scheduler,
        block_size=config.block_size,
        num_kv_blocks=config.num_kv_blocks,
        dtype=config.dtype,
        device=config.device,
    )


def build_server(config: ServeConfig) -> Server:
    """Everything ``loraplex serve`` runs, ready for uvicorn (close it after)."""
    config.data_dir.mkdir(parents=True, exist_ok=True)
    assets = _demo_assets(config)
    model_dir = assets.base_model_dir if assets is not None else config.model
    if model_dir is None:
        raise ValueError("model None is invalid; expected a model directory or the demo assets")
    base = BaseModelSpec.from_dir(model_dir)
    registry_config = RegistryConfig(
        config.data_dir, config.database_url, config.store, config.s3_endpoint,
        config.max_lora_rank,
    )  # fmt: skip
    registry = open_registry(registry_config, base=base)
    try:
        demo = assets if config.demo else None
        return _assemble(config, model_dir, base, registry, demo)
    except BaseException:
        registry.close()
        raise


def _assemble(
    config: ServeConfig,
    model_dir: Path,
    base: BaseModelSpec,
    registry: Registry,
    demo: DemoAssets | None,
) -> Server:
    keys: dict[str, str] = {}
    if demo is not None:
        state = register_demo(registry, demo)
        keys = sample_keys(registry, state.tenants, config.data_dir)
    admin = config.admin_key or admin_key(config.data_dir)
    runtime = _runtime(config, base, registry)
    try:
        apply_warm_policies(registry, runtime, base.digest)
        engine = _start_engine(model_dir, config, runtime)
    except BaseException:
        runtime.cache.close()
        raise
    settings = ServerConfig(
        base_model_name=base.name, admin_key=admin, import_dir=config.import_dir,
        queue_deadline_s=config.queue_deadline_s, max_prompt_tokens=config.max_model_len - 1,
        vocab_size=base.vocab_size, metrics_public=config.metrics_public,
    )  # fmt: skip
    deps = ServerDeps(
        settings, engine, registry, runtime.cache, ChatTemplate.from_model_dir(model_dir)
    )
    app = create_app(deps)
    app.state.refresh_tenants = TenantRefresher(registry, runtime)
    return Server(app, deps, engine, runtime, registry, admin, keys)


def _start_engine(model_dir: Path, config: ServeConfig, runtime: AdapterRuntime) -> AsyncEngine:
    from loraplex.engine.factory import build_engine

    return build_engine(model_dir, _engine_config(config), runtime)
