"""The settings of a simulated replica's real components, made from a ``SimConfig`` as
``engine.factory`` makes them from a served config (that module loads torch, so the simulator
does not import it): the adapter cache's, the scheduler's and the tenants' limits.
"""

from __future__ import annotations

from collections.abc import Mapping

from loraplex.engine.config import SchedulerConfig
from loraplex.engine.tenant_shares import TenantSettings
from loraplex.residency.cache import CacheConfig, TieredAdapterCache
from loraplex.residency.ledger import Tier, TierBudget
from loraplex.residency.warm import AutoWarmConfig
from loraplex.sim.config import SimConfig


def cache_config(config: SimConfig) -> CacheConfig:
    """The cache ``engine.factory.build_adapter_runtime`` builds for the same settings."""
    slots, share = config.max_loras, config.default_tenant_tier_share
    return CacheConfig(
        budgets={
            Tier.L0: TierBudget(slots * config.slot_bytes, slots, default_tenant_share=share),
            Tier.L1: TierBudget(config.cpu_adapter_bytes, default_tenant_share=share),
            Tier.L2: TierBudget(config.disk_cache_bytes, default_tenant_share=share),
        },
        max_concurrent_loads=config.max_concurrent_loads,
        tenant_max_concurrent_loads=config.tenant_max_concurrent_loads,
        default_deadline_s=config.queue_deadline_s,
        auto_warm=AutoWarmConfig() if config.auto_warm else None,
        max_auto_gpu_slots=config.auto_gpu_slots,
    )


def scheduler_config(config: SimConfig) -> SchedulerConfig:
    return SchedulerConfig(
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=config.max_model_len,
        default_deadline_s=config.queue_deadline_s,
        max_queue_len=config.max_queue_len,
        step_work_ratio=config.step_work_ratio,
    )


_CAP_FIELDS = {Tier.L0: "max_gpu_bytes", Tier.L1: "max_cpu_bytes", Tier.L2: "max_disk_bytes"}


def apply_tenants(cache: TieredAdapterCache, tenants: Mapping[str, TenantSettings]) -> None:
    """The tenants' keep-priority weights and per-tier byte caps, handed to the cache as
    ``engine.factory.apply_tenant_settings`` hands them (that module loads torch)."""
    caps = {
        tier: {t: cap for t, s in tenants.items() if (cap := getattr(s, name)) is not None}
        for tier, name in _CAP_FIELDS.items()
    }
    cache.set_tenant_limits({t: s.weight for t, s in tenants.items()}, caps)
