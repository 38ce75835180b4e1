"""Wiring: the adapter cache built around the model's slot pool, and the engine around both.

The slot pool is shared: the cache's L0 tier fills it (on its worker threads), the model reads
it in every forward. Both sides take the same ``slot_lock``, so a slot fill never overlaps a
forward. Build in this order::

    runtime = build_adapter_runtime(spec, resolver, store, disk_dir, AdapterRuntimeConfig(...))
    engine = build_engine(model_dir, EngineConfig(...), runtime)
    ...
    engine.shutdown(); runtime.cache.close()

Tenants: ``AdapterRuntimeConfig.tenants`` (from the registry, see ``engine.tenant_shares``)
become the cache's per-tenant priority and per-tier byte caps, and the scheduler's fair-share
weights and cold-load quotas. ``runtime.update_tenant_settings`` applies a change live.

Warm policies: with ``AdapterRuntimeConfig.auto_warm`` (the default) the engine core rebalances
the cache every ``auto_warm_interval_s``, pinning revisions in L1 by their request rates, and
in L0 up to ``max_auto_gpu_slots`` of them (0, the default here: CPU only).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.store import ArtifactStore
from loraplex.clock import Clock, MonotonicClock
from loraplex.devices import torch_device
from loraplex.dtypes import DEFAULT_DTYPE, check_dtype, torch_dtype
from loraplex.engine.config import EngineConfig
from loraplex.engine.core import EngineCore
from loraplex.engine.kv.blocks import BlockManager
from loraplex.engine.kv.paged import PagedKVCache
from loraplex.engine.merge_holds import MergeHolds
from loraplex.engine.mode_control import ModeController
from loraplex.engine.mode_policy import ModeKind, ModePolicyConfig, ModeSetting
from loraplex.engine.model_load import log_weight_memory
from loraplex.engine.modes import ModeSwitcher
from loraplex.engine.runner import ModelRunner
from loraplex.engine.sched.scheduler import Scheduler
from loraplex.engine.tenant_shares import TenantBook, TenantSettings
from loraplex.engine.transport.thread_client import AsyncEngine
from loraplex.engine.watchdog import WatchdogPolicy
from loraplex.model.checkpoint import load_checkpoint
from loraplex.model.llama import LlamaModel
from loraplex.model.lora import LoraSlotPool
from loraplex.model.tokenizer import TextTokenizer
from loraplex.residency.cache import CacheConfig, TieredAdapterCache
from loraplex.residency.ledger import Tier, TierBudget, check_tier_share
from loraplex.residency.policy import DEFAULT_POLICY, make_policy
from loraplex.residency.warm import AutoWarmConfig
from loraplex.runtime.tier_backends import ArtifactRef, DiskTier, TierPipeline


@dataclass(frozen=True)
class AdapterRuntimeConfig:
    """The slot pool and the cache's byte budgets (vLLM's --max-loras, --max-lora-rank, ...)."""

    max_loras: int = 8  # GPU slots (L0)
    max_lora_rank: int = 64  # largest rank a slot holds
    cpu_adapter_bytes: int = 1 << 30  # L1 budget
    disk_cache_bytes: int = 8 << 30  # L2 budget
    policy: str = DEFAULT_POLICY  # eviction policy name
    dtype: str = DEFAULT_DTYPE  # adapter weights' dtype (the model's)
    device: str = "cpu"  # the model's device
    max_concurrent_loads: int = 4  # adapter loads in flight, all tenants
    tenant_max_concurrent_loads: int = 2  # loads in flight per tenant (cold-load quota)
    tenants: Mapping[str, TenantSettings] = field(default_factory=dict)  # priority and quotas
    # Automatic warm promotion/demotion from each revision's rolling request rates; None: off
    # (operator warm policies still apply).
    auto_warm: AutoWarmConfig | None = field(default_factory=AutoWarmConfig)
    auto_warm_interval_s: float = 5.0  # engine-clock seconds between two automatic rebalances
    max_auto_gpu_slots: int = 0  # GPU slots automatic gpu promotion may pin (< max_loras)
    # the fraction of each tier every tenant keeps against the others (work-conserving: free
    # room beyond it is borrowed, reclaimed first when another tenant needs room); 1.0: none
    default_tenant_tier_share: float = 1.0
    # the shares hold only against tenants of the same or lower priority (CacheConfig's
    # tier_share_by_priority)
    tier_share_by_priority: bool = False

    def __post_init__(self) -> None:
        for name in (
            "max_loras",
            "max_lora_rank",
            "max_concurrent_loads",
            "tenant_max_concurrent_loads",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")
        for name in ("cpu_adapter_bytes", "disk_cache_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 0")
        if not 0 <= self.max_auto_gpu_slots < self.max_loras:
            raise ValueError(
                f"max_auto_gpu_slots {self.max_auto_gpu_slots} is invalid; expected 0 to "
                f"max_loras - 1 ({self.max_loras - 1})"
            )
        check_dtype(self.dtype)
        check_tier_share(self.default_tenant_tier_share)
        if not self.auto_warm_interval_s > 0:
            raise ValueError(
                f"auto_warm_interval_s {self.auto_warm_interval_s} is invalid; expected > 0"
            )


@dataclass(frozen=True)
class AdapterRuntime:
    """The pieces the engine shares with the adapter cache."""

    pool: LoraSlotPool  # L0 slots, read by the model
    slot_lock: threading.Lock  # held by slot fills and by every forward
    cache: TieredAdapterCache  # the tiered cache (recovered, ready to acquire)
    pipeline: TierPipeline  # its tier pipeline (L1 memory, L2 disk)
    tenants: TenantBook = field(default_factory=TenantBook)  # shared with the engine
    rebalance_interval_s: float | None = None  # automatic warm rebalance period; None: off
    # revisions an admin action is taking away: the engine does not merge them (docs/modes.md)
    merge_holds: MergeHolds = field(default_factory=MergeHolds)

    def update_tenant_settings(self, settings: Mapping[str, TenantSettings]) -> None:
        """Replaces every tenant's settings (thread-safe; the next step and the next eviction
        decision use them). A lowered byte cap evicts that tenant's idle copies down to it;
        copies in use stay until released."""
        self.tenants.replace(settings)
        apply_tenant_settings(self.cache, settings)


_QUOTA_FIELDS = {Tier.L0: "max_gpu_bytes", Tier.L1: "max_cpu_bytes", Tier.L2: "max_disk_bytes"}


def apply_tenant_settings(
    cache: TieredAdapterCache, settings: Mapping[str, TenantSettings]
) -> None:
    """Hands the tenants' priority weights and per-tier byte caps to the cache (live)."""
    cache.set_tenant_limits(
        {tenant: s.weight for tenant, s in settings.items()},
        {tier: _caps(settings, tier) for tier in cache.ledgers},
    )


def _caps(settings: Mapping[str, TenantSettings], tier: Tier) -> dict[str, int]:
    caps = {t: getattr(s, _QUOTA_FIELDS[tier]) for t, s in settings.items()}
    return {t: cap for t, cap in caps.items() if cap is not None}


def build_adapter_runtime(
    base: BaseModelSpec,
    resolver: Callable[[AdapterKey], ArtifactRef],
    store: ArtifactStore,
    disk_dir: Path,
    config: AdapterRuntimeConfig,
    *,
    clock: Clock | None = None,
) -> AdapterRuntime:
    """A slot pool, a TierPipeline over ``store`` and ``disk_dir``, and the recovered cache."""
    dtype, device = torch_dtype(config.dtype), torch_device(config.device)
    pool = LoraSlotPool(base, config.max_loras, config.max_lora_rank, dtype=dtype, device=device)
    slot_lock = threading.Lock()
    pipeline = TierPipeline(resolver, store, DiskTier(disk_dir), pool, base, slot_lock=slot_lock)
    share = config.default_tenant_tier_share
    budgets = {
        Tier.L0: TierBudget(pool.total_bytes, config.max_loras, default_tenant_share=share),
        Tier.L1: TierBudget(config.cpu_adapter_bytes, default_tenant_share=share),
        Tier.L2: TierBudget(config.disk_cache_bytes, default_tenant_share=share),
    }
    cache_config = CacheConfig(
        budgets,
        max_concurrent_loads=config.max_concurrent_loads,
        tenant_max_concurrent_loads=config.tenant_max_concurrent_loads,
        auto_warm=config.auto_warm,
        max_auto_gpu_slots=config.max_auto_gpu_slots,
        tier_share_by_priority=config.tier_share_by_priority,
    )
    cache = TieredAdapterCache(
        cache_config, pipeline, policy=make_policy(config.policy), clock=clock or MonotonicClock()
    )
    apply_tenant_settings(cache, config.tenants)
    cache.recover()
    interval = None if config.auto_warm is None else config.auto_warm_interval_s
    return AdapterRuntime(pool, slot_lock, cache, pipeline, TenantBook(config.tenants), interval)


def build_engine(
    model_dir: Path,
    config: EngineConfig,
    runtime: AdapterRuntime | None,
    *,
    clock: Clock | None = None,
    watchdog: WatchdogPolicy | None = None,
) -> AsyncEngine:
    """Load the base model and start the engine thread; ``runtime`` None serves the base only;
    ``watchdog``: when its loop counts as hung (None: the defaults)."""
    core = build_engine_core(model_dir, config, runtime, clock=clock)
    max_loras = 0 if runtime is None else runtime.pool.max_loras
    return AsyncEngine(core, config.idle_wait_s, max_loras=max_loras, watchdog=watchdog)


def build_engine_core(
    model_dir: Path,
    config: EngineConfig,
    runtime: AdapterRuntime | None,
    *,
    clock: Clock | None = None,
    model: LlamaModel | None = None,
) -> EngineCore:
    """The base model, paged KV cache, scheduler and runner around ``runtime`` (no thread);
    ``model``: the checkpoint of ``model_dir`` already loaded as ``config`` asks
    (``engine.model_load.load_in_background``), else it is loaded here."""
    if model is None:
        device = torch_device(config.device)  # ValueError naming device when it is not here
        dtype, kernel = torch_dtype(config.dtype), config.base_linear_kernel
        model = load_checkpoint(model_dir, dtype=dtype, device=device, linear_kernel=kernel)
        log_weight_memory(model)
    clock = clock or MonotonicClock()
    blocks = BlockManager(config.num_kv_blocks, config.block_size)
    kv = PagedKVCache(model.attention_shape, blocks, dtype=model.dtype, device=model.device)
    tenants = TenantBook() if runtime is None else runtime.tenants
    scheduler = Scheduler(config.scheduler, blocks, clock, tenants)
    pool = None if runtime is None else runtime.pool
    slot_lock = threading.Lock() if runtime is None else runtime.slot_lock
    runner = ModelRunner(model, kv, pool, slot_lock)
    cache = None if runtime is None else runtime.cache
    interval = None if runtime is None else runtime.rebalance_interval_s
    tokenizer = TextTokenizer(model_dir)
    core = EngineCore(scheduler, runner, cache, tokenizer, clock, rebalance_interval_s=interval)
    setting = ModeSetting.parse(config.mode)
    if setting.kind is not ModeKind.UNMERGED:
        if runtime is None:
            raise ValueError(f"mode {config.mode!r} is invalid without adapters; expected unmerged")
        switcher = ModeSwitcher(runner, runtime.pool, clock, holds=runtime.merge_holds)
        policy = ModePolicyConfig(merge_step_budget_s=config.merge_step_budget_s)
        core.modes = ModeController(setting, switcher, runtime.cache, clock, policy=policy)
    return core
