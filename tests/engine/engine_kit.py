"""A real engine over the demo model: LocalArtifactStore -> TierPipeline -> TieredAdapterCache
-> LoraSlotPool shared with the model. ``GatedPipeline`` is the real pipeline whose L3 fetch of
chosen adapters blocks until the test opens their gate (a slow load without timing games)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.identity import AdapterKey, sha256_file
from loraplex.artifacts.store import LocalArtifactStore
from loraplex.artifacts.validate import validate_adapter_dir
from loraplex.demo.assets import DemoAdapter, DemoAssets
from loraplex.engine.config import EngineConfig, SchedulerConfig
from loraplex.engine.factory import AdapterRuntime, build_engine
from loraplex.engine.protocol import EngineRequest, TokenDelta
from loraplex.engine.transport.thread_client import AsyncEngine
from loraplex.engine.watchdog import WatchdogPolicy
from loraplex.model.lora import LoraSlotPool
from loraplex.residency.cache import CacheConfig, TieredAdapterCache
from loraplex.residency.ledger import Tier, TierBudget
from loraplex.residency.pipeline import CancelToken, Move, Prepared
from loraplex.runtime.tier_backends import ArtifactRef, DiskTier, TierPipeline
from loraplex.sampling import SamplingParams


class GatedPipeline(TierPipeline):
    """The real pipeline; fetches of keys in ``gates`` wait for their event."""

    gates: dict[AdapterKey, threading.Event]

    def prepare(self, move: Move, cancel: CancelToken) -> Prepared:
        gate = self.gates.get(move.key)
        if gate is not None and move.target is Tier.L2:
            gate.wait(timeout=60)
        return super().prepare(move, cancel)


@dataclass
class Stack:
    assets: DemoAssets
    keys: dict[str, AdapterKey]  # demo ref -> key
    runtime: AdapterRuntime
    pipeline: GatedPipeline
    engine: AsyncEngine

    def key(self, adapter: DemoAdapter) -> AdapterKey:
        return self.keys[adapter.ref]

    def close(self) -> None:
        for gate in self.pipeline.gates.values():
            gate.set()
        self.engine.shutdown()
        self.runtime.cache.close()


def publish(
    assets: DemoAssets, base: BaseModelSpec, store_dir: Path
) -> tuple[LocalArtifactStore, dict[AdapterKey, ArtifactRef]]:
    """Every demo adapter's files in a new store, and each revision's artifact reference (in
    manifest order)."""
    store = LocalArtifactStore(store_dir)
    refs: dict[AdapterKey, ArtifactRef] = {}
    for adapter in assets.adapters:
        files = [adapter.path / "adapter_config.json", adapter.path / "adapter_model.safetensors"]
        digests = [sha256_file(f) for f in files]
        for f, d in zip(files, digests, strict=True):
            store.put_file(f, d)
        memory = validate_adapter_dir(adapter.path, base, 64).tensor_bytes
        size = sum(f.stat().st_size for f in files)
        refs[adapter.key(base.digest)] = ArtifactRef(digests[0], digests[1], size, memory)
    return store, refs


def gated_runtime(
    assets: DemoAssets, root: Path, *, max_loras: int, tenant_max_concurrent_loads: int = 4
) -> tuple[AdapterRuntime, GatedPipeline]:
    """The demo adapters published to a store under ``root``, and the adapter runtime over them:
    ``max_loras`` rank-64 slots, 1 GiB of host memory, 4 GiB of disk, a gated pipeline."""
    base = BaseModelSpec.from_dir(assets.base_model_dir)
    store, refs = publish(assets, base, root / "store")
    pool = LoraSlotPool(base, max_loras, 64, dtype=torch.float32, device=torch.device("cpu"))
    lock = threading.Lock()
    pipeline = GatedPipeline(refs.__getitem__, store, DiskTier(root / "l2"), pool, base,
                             slot_lock=lock)  # fmt: skip
    pipeline.gates = {}
    budgets = {Tier.L0: TierBudget(pool.total_bytes, max_loras), Tier.L1: TierBudget(1 << 30),
               Tier.L2: TierBudget(1 << 32)}  # fmt: skip
    config = CacheConfig(budgets, tenant_max_concurrent_loads=tenant_max_concurrent_loads)
    cache = TieredAdapterCache(config, pipeline)
    return AdapterRuntime(pool, lock, cache, pipeline), pipeline


def build_stack(
    assets: DemoAssets,
    root: Path,
    *,
    max_loras: int,
    sched: SchedulerConfig,
    watchdog: WatchdogPolicy | None = None,
) -> Stack:
    base = BaseModelSpec.from_dir(assets.base_model_dir)
    keys = {adapter.ref: adapter.key(base.digest) for adapter in assets.adapters}
    runtime, pipeline = gated_runtime(assets, root, max_loras=max_loras)
    runtime.cache.recover()
    config = EngineConfig(scheduler=sched, block_size=8, num_kv_blocks=256, idle_wait_s=0.01)
    engine = build_engine(assets.base_model_dir, config, runtime, watchdog=watchdog)
    return Stack(assets, keys, runtime, pipeline, engine)


def probe_request(stack: Stack, adapter: DemoAdapter, rid: str, **kw: object) -> EngineRequest:
    ids = tuple(stack.engine.tokenizer.encode(adapter.probe_prompt))
    params = SamplingParams(max_tokens=adapter.probe_max_tokens)
    return EngineRequest(rid, adapter.tenant, stack.key(adapter), ids, params, **kw)  # type: ignore[arg-type]


async def collect(engine: AsyncEngine, request: EngineRequest) -> list[TokenDelta]:
    return [delta async for delta in engine.generate(request)]


def text_of(deltas: list[TokenDelta]) -> str:
    return "".join(d.text for d in deltas)


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)
