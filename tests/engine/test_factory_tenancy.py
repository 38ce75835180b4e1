"""Tenant settings reach the adapter cache: priorities, per-tier byte caps, live updates."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from engine_kit import publish

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.factory import AdapterRuntime, AdapterRuntimeConfig, build_adapter_runtime
from loraplex.engine.tenant_shares import PRIORITY_WEIGHTS, TenantSettings
from loraplex.residency.ledger import Tier

if TYPE_CHECKING:
    from loraplex.demo.assets import DemoAssets

HIGH = "acme"
BATCH = "globex"


def _runtime(
    assets: DemoAssets,
    root: Path,
    *,
    policy: str = "lru",
    tenants: dict[str, TenantSettings] | None = None,
) -> tuple[AdapterRuntime, list[AdapterKey]]:
    """A real runtime (4 slots) over the demo adapters; keys in manifest order."""
    base = BaseModelSpec.from_dir(assets.base_model_dir)
    store, refs = publish(assets, base, root / "store")
    config = AdapterRuntimeConfig(max_loras=4, policy=policy, tenants=tenants or {})
    runtime = build_adapter_runtime(base, refs.__getitem__, store, root / "l2", config)
    return runtime, list(refs)


def _use(runtime: AdapterRuntime, key: AdapterKey) -> None:
    runtime.cache.acquire_future(key).result(timeout=60).release()


def _l0_bytes(runtime: AdapterRuntime, tenant: str) -> int:
    return runtime.cache.ledgers[Tier.L0].tenant_bytes.get(tenant, 0)


def _of(keys: list[AdapterKey], tenant: str) -> list[AdapterKey]:
    return [k for k in keys if k.tenant == tenant]


def test_priorities_and_budgets_reach_the_cache(demo_assets: DemoAssets, tmp_path: Path) -> None:
    batch = TenantSettings.for_priority(
        "batch", max_gpu_bytes=1000, max_cpu_bytes=2000, max_cold_loads=1
    )
    settings = {HIGH: TenantSettings.for_priority("high"), BATCH: batch}
    runtime, _ = _runtime(demo_assets, tmp_path, tenants=settings)
    try:
        cache = runtime.cache
        assert cache.config.tenant_priority == {HIGH: 4.0, BATCH: 0.25}
        assert cache.ledgers[Tier.L0].budget.tenant_max_bytes == {BATCH: 1000}
        assert cache.ledgers[Tier.L1].budget.tenant_max_bytes == {BATCH: 2000}
        assert cache.ledgers[Tier.L2].budget.tenant_max_bytes == {}
        assert cache.config.budgets[Tier.L0].num_slots == 4  # the rest of the budget is kept
        assert runtime.tenants.max_cold_loads(BATCH) == 1
        assert runtime.tenants.weight(HIGH) == PRIORITY_WEIGHTS["high"]
        assert runtime.tenants.weight("unknown") == 1.0
    finally:
        runtime.cache.close()


@pytest.mark.parametrize("capped", [True, False])
def test_budgeted_batch_tenant_cannot_evict_high_priority_adapters(
    demo_assets: DemoAssets, tmp_path: Path, capped: bool
) -> None:
    """lru ignores priority, so what protects the high tenant here is the batch tenant's GPU
    byte budget alone (without it, the same sequence evicts the high tenant's adapters)."""
    runtime, keys = _runtime(demo_assets, tmp_path)
    slot = runtime.pool.bytes_per_slot
    cap = slot if capped else None
    runtime.update_tenant_settings({
        HIGH: TenantSettings.for_priority("high"),
        BATCH: TenantSettings.for_priority("batch", max_gpu_bytes=cap),
    })  # fmt: skip
    try:
        high = _of(keys, HIGH)[:3]
        for key in high:
            _use(runtime, key)
        for key in _of(keys, BATCH):
            _use(runtime, key)
        resident = [runtime.cache.is_resident(k, Tier.L0) for k in high]
        if capped:
            assert resident == [True, True, True]
            assert _l0_bytes(runtime, BATCH) <= slot
        else:
            assert not all(resident)
        runtime.cache.check_integrity()
    finally:
        runtime.cache.close()


def test_live_update_trims_and_reprioritises(demo_assets: DemoAssets, tmp_path: Path) -> None:
    runtime, keys = _runtime(demo_assets, tmp_path, policy="cost_aware")
    try:
        for key in _of(keys, BATCH)[:3]:
            _use(runtime, key)
        slot = runtime.pool.bytes_per_slot
        assert _l0_bytes(runtime, BATCH) == 3 * slot
        runtime.update_tenant_settings(
            {BATCH: TenantSettings.for_priority("batch", max_gpu_bytes=slot)}
        )
        assert _l0_bytes(runtime, BATCH) == slot  # idle copies above the new cap were dropped
        assert runtime.cache.config.tenant_priority == {BATCH: 0.25}
        runtime.cache.check_integrity()
        runtime.update_tenant_settings({})  # back to defaults: no caps, priority 1
        assert runtime.cache.ledgers[Tier.L0].budget.tenant_max_bytes == {}
        assert runtime.tenants.weight(BATCH) == 1.0
    finally:
        runtime.cache.close()


def test_settings_validate() -> None:
    with pytest.raises(ValueError, match="priority 'urgent'"):
        TenantSettings.for_priority("urgent")
    with pytest.raises(ValueError, match="max_cold_loads 0"):
        TenantSettings(max_cold_loads=0)
    with pytest.raises(ValueError, match="weight 0"):
        TenantSettings(weight=0)
