"""Automatic warm policies run in the engine: the core rebalances the cache at most once per
interval of its clock, so a revision's sustained traffic pins its copy and silence unpins it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from engine_kit import publish

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.identity import AdapterKey
from loraplex.clock import ManualClock
from loraplex.engine.config import EngineConfig, SchedulerConfig
from loraplex.engine.core import EngineCore
from loraplex.engine.factory import AdapterRuntimeConfig, build_adapter_runtime, build_engine_core
from loraplex.engine.protocol import EngineRequest, TokenDelta
from loraplex.residency.cache import TieredAdapterCache
from loraplex.residency.ledger import Tier
from loraplex.residency.warm import AutoWarmConfig
from loraplex.sampling import SamplingParams

if TYPE_CHECKING:
    from loraplex.demo.assets import DemoAdapter, DemoAssets

INTERVAL_S = 5.0
# 8 requests in an hour reach cpu_rps (8/3600 > 0.001); the 5-minute rate stays below gpu_rps.
WARM = AutoWarmConfig(gpu_rps=1.0, cpu_rps=0.001)


def _serve(core: EngineCore, woke: threading.Event, request: EngineRequest) -> str:
    """Steps ``core`` until ``request`` ends (sleeping only while an adapter load is running)."""
    out: list[TokenDelta | BaseException] = []
    core.add(request, out.append)
    deadline = time.monotonic() + 60
    while request.request_id in core.scheduler.requests:
        assert time.monotonic() < deadline, "the request did not finish"
        if not core.step():
            woke.wait(0.5)
            woke.clear()
    assert all(isinstance(d, TokenDelta) for d in out), out
    return "".join(d.text for d in out if isinstance(d, TokenDelta))


def _pinned(cache: TieredAdapterCache, key: AdapterKey) -> set[Tier]:
    return {e.tier for e in cache.snapshot().entries if e.key == key and e.pinned}


def _wait_pinned(cache: TieredAdapterCache, key: AdapterKey, tier: Tier) -> None:
    """A promotion may have to load the copy first (on the cache's worker threads)."""
    deadline = time.monotonic() + 30
    while tier not in _pinned(cache, key):
        assert time.monotonic() < deadline, f"{key.ref} never pinned in {tier.name}"
        time.sleep(0.01)


def test_traffic_promotes_a_revision_and_silence_demotes_it(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    clock = ManualClock()
    base = BaseModelSpec.from_dir(demo_assets.base_model_dir)
    store, refs = publish(demo_assets, base, tmp_path / "store")
    config = AdapterRuntimeConfig(max_loras=2, auto_warm=WARM, auto_warm_interval_s=INTERVAL_S)
    runtime = build_adapter_runtime(
        base, refs.__getitem__, store, tmp_path / "l2", config, clock=clock
    )
    sched = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=128, max_model_len=256)
    engine = EngineConfig(scheduler=sched, block_size=8, num_kv_blocks=256)
    core = build_engine_core(demo_assets.base_model_dir, engine, runtime, clock=clock)
    woke = threading.Event()
    core.on_lease_done = woke.set
    cache = runtime.cache
    try:
        adapter: DemoAdapter = demo_assets.adapters[0]
        key = adapter.key(base.digest)
        ids = tuple(core.tokenizer.encode(adapter.probe_prompt))
        params = SamplingParams(max_tokens=adapter.probe_max_tokens)
        for i in range(8):  # sustained traffic, all within the first interval
            request = EngineRequest(f"r{i}", adapter.tenant, key, ids, params)
            assert _serve(core, woke, request) == adapter.expected_continuation
            clock.advance(0.5)
        assert _pinned(cache, key) == set()  # no rebalance before the interval is up
        clock.advance(INTERVAL_S)
        core.step()
        _wait_pinned(cache, key, Tier.L1)  # promoted to cpu: its L1 copy is kept
        clock.advance(2 * 3600.0)  # silence: the hourly rate decays below the demotion bar
        core.step()
        assert _pinned(cache, key) == set()
        cache.check_integrity()
    finally:
        core.close()
        cache.close()


def test_auto_warm_settings_validate() -> None:
    with pytest.raises(ValueError, match="auto_warm_interval_s 0"):
        AdapterRuntimeConfig(auto_warm_interval_s=0)
    assert AdapterRuntimeConfig().auto_warm == AutoWarmConfig()  # on by default
    AdapterRuntimeConfig(auto_warm=None)  # off
    assert AdapterRuntimeConfig().max_auto_gpu_slots == 0  # built alone: CPU-only promotion
    for bad in (-1, 8):
        with pytest.raises(ValueError, match=f"max_auto_gpu_slots {bad} is invalid"):
            AdapterRuntimeConfig(max_loras=8, max_auto_gpu_slots=bad)
