"""Tenant priority and quotas in the engine: fair-share weights from the priority class, the
cold-load quota, and a budgeted batch tenant's cold storm leaving a high tenant's slots alone."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from engine_kit import Stack, build_stack, collect, probe_request, text_of, wait_until
from sched_kit import Driver, request

from loraplex.engine.config import SchedulerConfig
from loraplex.engine.tenant_shares import TenantBook, TenantSettings
from loraplex.residency.ledger import Tier

if TYPE_CHECKING:
    from loraplex.demo.assets import DemoAdapter, DemoAssets

HIGH = "acme"
BATCH = "globex"


def test_priority_classes_weight_token_shares() -> None:
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=64)
    tenants = TenantBook(
        {"hi": TenantSettings.for_priority("high"), "lo": TenantSettings.for_priority("normal")}
    )
    driver = Driver(cfg, num_blocks=256, tenants=tenants)
    for i in range(200):
        driver.add(request(f"hi{i}", "hi", prompt=8, out=4, first=i))
        driver.add(request(f"lo{i}", "lo", prompt=8, out=4, first=500 + i))
    for _ in range(150):
        driver.step()
    ratio = driver.tokens_by_tenant["hi"] / driver.tokens_by_tenant["lo"]
    assert 3.2 < ratio < 4.8, ratio


def _adapters(assets: DemoAssets, tenant: str) -> list[DemoAdapter]:
    return [a for a in assets.adapters if a.tenant == tenant]


async def _storm(stack: Stack, high: list[DemoAdapter], batch: list[DemoAdapter]) -> None:
    """Batch tenant's cold adapters gated; high requests run meanwhile; then the gates open."""
    cache = stack.runtime.cache
    storm = [asyncio.create_task(collect(stack.engine, probe_request(stack, a, f"s{i}")))
             for i, a in enumerate(batch)]  # fmt: skip
    await wait_until(lambda: cache.snapshot().num_loading >= 1)
    # The quota: one cold load at a time for the batch tenant, however many it asks for.
    for _ in range(20):
        assert cache.snapshot().num_loading <= 1
        await asyncio.sleep(0.01)
    warm = [await asyncio.wait_for(collect(stack.engine, probe_request(stack, a, f"w{i}")), 30)
            for i, a in enumerate(high)]  # fmt: skip
    assert [text_of(d) for d in warm] == [a.expected_continuation for a in high]
    assert not any(t.done() for t in storm)  # the storm was still loading all along
    for gate in stack.pipeline.gates.values():
        gate.set()
    done = await asyncio.gather(*storm)
    assert [text_of(d) for d in done] == [a.expected_continuation for a in batch]


def test_budgeted_batch_storm_keeps_high_tenant_resident(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=128, max_model_len=256,
                            lease_lookahead=16, max_queue_len=64)  # fmt: skip
    stack = build_stack(demo_assets, tmp_path, max_loras=4, sched=sched)
    try:
        slot = stack.runtime.pool.bytes_per_slot
        stack.runtime.update_tenant_settings({
            HIGH: TenantSettings.for_priority("high"),
            BATCH: TenantSettings.for_priority("batch", max_gpu_bytes=slot, max_cold_loads=1),
        })  # fmt: skip
        high = [a for a in _adapters(demo_assets, HIGH) if a.revision == "r1"][:3]
        for i, adapter in enumerate(high):
            deltas = asyncio.run(collect(stack.engine, probe_request(stack, adapter, f"p{i}")))
            assert text_of(deltas) == adapter.expected_continuation
        batch = _adapters(demo_assets, BATCH)
        stack.pipeline.gates = {stack.key(a): threading.Event() for a in batch}
        asyncio.run(_storm(stack, high, batch))
        snapshot = stack.runtime.cache.snapshot()
        for adapter in high:
            entry = next(e for e in snapshot.entries
                         if e.key == stack.key(adapter) and e.tier is Tier.L0)  # fmt: skip
            assert entry.ready and entry.evictions == 0, entry
        assert stack.runtime.cache.ledgers[Tier.L0].tenant_bytes.get(BATCH, 0) <= slot
        stack.runtime.cache.check_integrity()
    finally:
        stack.close()


def test_requests_held_back_by_a_cold_load_quota_take_no_room_in_the_lease_window(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    """Two tenants of one class; the storming one (one cold load at a time) is ahead in fair
    order because the other has run before. With a lease window of 2, its queued cold requests
    would fill the window while they wait for its quota, and the other tenant's requests would
    never be leased; they take no room, so the other tenant is answered during the storm."""
    sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=128, max_model_len=256,
                            lease_lookahead=2, max_queue_len=64)  # fmt: skip
    stack = build_stack(demo_assets, tmp_path, max_loras=8, sched=sched)
    try:
        stack.runtime.update_tenant_settings({
            HIGH: TenantSettings(weight=1.0),
            BATCH: TenantSettings(weight=1.0, max_cold_loads=1),
        })  # fmt: skip
        high = [a for a in _adapters(demo_assets, HIGH) if a.revision == "r1"][:3]
        for i, adapter in enumerate(high):  # runs first: its virtual time moves ahead
            asyncio.run(collect(stack.engine, probe_request(stack, adapter, f"p{i}")))
        batch = _adapters(demo_assets, BATCH)
        stack.pipeline.gates = {stack.key(a): threading.Event() for a in batch}
        asyncio.run(_storm(stack, high, batch))
        stack.runtime.cache.check_integrity()
    finally:
        stack.close()
