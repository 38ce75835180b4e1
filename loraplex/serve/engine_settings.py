"""What the server process derives from ``ServeConfig`` and the registry for its engine side: the
tenants' settings, the engine and watchdog configs, the registry location. Torch-free: the HTTP
process reads these, the engine side (``serve/engine_side.py``, in the engine's child process or
on a thread) builds with them.
"""

from __future__ import annotations

import logging

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.engine.config import EngineConfig, SchedulerConfig
from loraplex.engine.tenant_shares import SeatLimits, TenantSettings
from loraplex.engine.watchdog import WatchdogPolicy
from loraplex.registry import Registry, RegistryConfig, Tenant
from loraplex.serve.config import ServeConfig

_log = logging.getLogger(__name__)


def settings_of(tenant: Tenant) -> TenantSettings:
    """What the engine and the cache enforce for one registry tenant."""
    quotas = tenant.quotas
    return TenantSettings.for_priority(
        tenant.priority.value,
        max_gpu_bytes=quotas.max_gpu_bytes,
        max_cpu_bytes=quotas.max_cpu_bytes,
        max_disk_bytes=quotas.max_disk_bytes,
        max_cold_loads=quotas.max_cold_loads,
        seats=SeatLimits(
            quotas.max_running_seqs, quotas.reserved_running_seqs, quotas.max_kv_blocks
        ),
    )


def tenant_settings(registry: Registry) -> dict[str, TenantSettings]:
    """Every registry tenant's settings (tenant name -> settings)."""
    return {t.name: settings_of(t) for t in registry.list_tenants()}


def warn_small_gpu_caps(settings: dict[str, TenantSettings], slot_bytes: int) -> None:
    """One WARNING naming the tenants whose ``max_gpu_bytes`` is below one GPU slot of
    ``slot_bytes`` (stored by ``tenants update`` or an earlier version; the admin API refuses
    it): none of their adapters can load, each request is a 422 ``tenant_cap_too_small``."""
    small = sorted(
        f"{name} ({s.max_gpu_bytes})"
        for name, s in settings.items()
        if s.max_gpu_bytes is not None and s.max_gpu_bytes < slot_bytes
    )
    if small:
        more = len(small) - _NAMED
        shown = ", ".join(small[:_NAMED]) + (f" and {more} more" if more > 0 else "")
        _log.warning(
            "max_gpu_bytes below one GPU slot of %d bytes: no adapter of these tenants can "
            "load (each adapter request is a 422 tenant_cap_too_small): %s; raise or lift it "
            "with PUT /admin/tenants/NAME",
            slot_bytes,
            shown,
        )


_NAMED = 10  # tenants a start-up warning names at most


def warm_policies(registry: Registry, base_digest: str) -> dict[AdapterKey, WarmPolicy]:
    """Every revision of this base model whose warm policy the cache must hold: one other than
    on-demand, or an operator's on-demand (automatic promotion off; schema 8)."""
    return registry.warm_policies(base_digest)


def engine_config(config: ServeConfig) -> EngineConfig:
    scheduler = SchedulerConfig(
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.batched_tokens(),
        max_model_len=config.max_model_len,
        default_deadline_s=config.queue_deadline_s,
        max_queue_len=config.max_queue_len,
        class_reserve_seqs=config.class_reserve_seqs,
        step_work_ratio=config.step_work_ratio,
        max_paused_kv_fraction=config.max_paused_kv_fraction,
    )
    return EngineConfig(
        scheduler=scheduler,
        block_size=config.block_size,
        num_kv_blocks=config.num_kv_blocks,
        dtype=config.dtype,
        device=config.device,
        mode=config.mode,
        merge_step_budget_s=config.merge_step_budget_s,
        base_linear_kernel=config.base_linear_kernel,
    )


def watchdog_policy(config: ServeConfig) -> WatchdogPolicy:
    """When the engine counts as hung, and when a hung engine process is killed."""
    return WatchdogPolicy(
        config.engine_hung_after_s,
        config.engine_hung_kill_after_s,
        config.engine_unresponsive_after_s,
    )


def registry_config(config: ServeConfig) -> RegistryConfig:
    return RegistryConfig(
        config.data_dir,
        config.database_url,
        config.store,
        config.s3_endpoint,
        config.max_lora_rank,
        config.database_connect_timeout_s,
        config.database_statement_timeout_s,
        config.database_lock_timeout_s,
        config.database_pool_size,
    )
