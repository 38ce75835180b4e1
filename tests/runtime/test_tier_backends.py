"""The real load pipeline (store -> quarantine -> verify -> disk -> memory -> slot): success,
every failure mode, and cancellation at every phase leave nothing behind."""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from adapter_builders import default_config

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.store import LocalArtifactStore
from loraplex.clock import ManualClock
from loraplex.errors import (
    AdapterError,
    ArtifactNotFoundError,
    BaseModelMismatchError,
    CorruptArtifactError,
    DigestMismatchError,
    LoadCancelledError,
    LoraplexError,
    RankTooLargeError,
)
from loraplex.model.lora import LoraSlotPool
from loraplex.residency.cache import CacheConfig, SimExecutor, TieredAdapterCache
from loraplex.residency.ledger import Tier, TierBudget
from loraplex.runtime.tier_backends import ArtifactRef, DiskTier, TierPipeline

MAX_RANK = 8


@dataclass
class World:
    cache: TieredAdapterCache
    pipeline: TierPipeline
    executor: SimExecutor
    store: LocalArtifactStore
    refs: dict[AdapterKey, ArtifactRef]
    tmp: Path

    def add(
        self,
        adapter_dir: Path,
        name: str,
        *,
        weights: bytes | None = None,
        key_digest: str | None = None,
    ) -> AdapterKey:
        cfg, wts = adapter_dir / "adapter_config.json", adapter_dir / "adapter_model.safetensors"
        if weights is not None:
            wts.write_bytes(weights)
        digests = [hashlib.sha256(p.read_bytes()).hexdigest() for p in (cfg, wts)]
        for path, digest in zip((cfg, wts), digests, strict=True):
            self.store.put_file(path, digest)
        base = self.pipeline.base.digest
        key = AdapterKey(base, "t", name, "r1", key_digest or digests[1])
        size = cfg.stat().st_size + wts.stat().st_size
        self.refs[key] = ArtifactRef(digests[0], digests[1], size, 4 * size)
        return key

    def leftovers(self) -> tuple[list[Path], set[AdapterKey], tuple[int, ...]]:
        committed = {self.pipeline.disk.path_for(k) for k in self.cache.ledgers[Tier.L2].entries}
        files = [p for p in self.pipeline.disk.files() if p.parent not in committed]
        memory = self.pipeline.memory.keys() - set(self.cache.ledgers[Tier.L1].entries)
        return files, memory, self.pipeline.pool.occupied_slots()


@pytest.fixture
def world(tmp_path: Path, base: BaseModelSpec) -> World:
    store = LocalArtifactStore(tmp_path / "store")
    pool = LoraSlotPool(base, 2, MAX_RANK, dtype=torch.float32, device=torch.device("cpu"))
    refs: dict[AdapterKey, ArtifactRef] = {}

    def resolver(key: AdapterKey) -> ArtifactRef:
        if key not in refs:
            raise ArtifactNotFoundError(f"no artifact for {key.ref}")
        return refs[key]

    pipeline = TierPipeline(resolver, store, DiskTier(tmp_path / "l2"), pool, base)
    budgets = {
        Tier.L0: TierBudget(2 * pool.bytes_per_slot, 2),
        Tier.L1: TierBudget(1 << 24),
        Tier.L2: TierBudget(1 << 24),
    }
    clock = ManualClock()
    executor = SimExecutor(clock)
    cache = TieredAdapterCache(CacheConfig(budgets), pipeline, clock=clock, executor=executor)
    return World(cache, pipeline, executor, store, refs, tmp_path)


def test_load_fills_every_tier_and_the_slot_holds_the_adapter(world: World, builder) -> None:  # type: ignore[no-untyped-def]
    key = world.add(builder.write(), "good")
    future = world.cache.acquire_future(key)
    world.executor.drain()
    lease = future.result(timeout=0)
    info = world.pipeline.pool.slot_info(lease.slot)
    assert info is not None and info.digest == key.adapter_digest
    assert lease.load.source is Tier.L3 and lease.load.total_s > 0
    assert world.pipeline.disk.path_for(key).joinpath("adapter_model.safetensors").exists()
    lease.release()
    world.cache.check_integrity()
    assert world.leftovers() == ([], set(), (lease.slot,))
    assert world.cache.evict(key, Tier.L0) and world.pipeline.pool.occupied_slots() == ()


def _truncated(world: World, builder) -> AdapterKey:  # type: ignore[no-untyped-def]
    path = builder.write()
    data = (path / "adapter_model.safetensors").read_bytes()
    return world.add(path, "trunc", weights=data[: len(data) // 2])


def _corrupted_in_store(world: World, builder) -> AdapterKey:  # type: ignore[no-untyped-def]
    key = world.add(builder.write(), "corrupt")
    obj = world.store.path_for(key.adapter_digest)
    obj.chmod(0o644)
    data = bytearray(obj.read_bytes())
    data[-1] ^= 0xFF
    obj.write_bytes(bytes(data))
    return key


def _missing(world: World, builder) -> AdapterKey:  # type: ignore[no-untyped-def]
    key = world.add(builder.write(), "gone")
    world.store.delete(key.adapter_digest)
    return key


CASES: dict[str, tuple[Callable, type[LoraplexError]]] = {  # type: ignore[type-arg]
    "truncated": (_truncated, CorruptArtifactError),
    "corrupt bytes in store": (_corrupted_in_store, DigestMismatchError),
    "digest mismatch": (
        lambda w, b: w.add(b.write(), "dm", key_digest="0" * 64),
        DigestMismatchError,
    ),
    "wrong base model": (
        lambda w, b: w.add(b.write(b.kit.config(base_model_name_or_path="x/other")), "wb"),
        BaseModelMismatchError,
    ),
    "rank above limit": (lambda w, b: w.add(b.write(b.kit.config(r=16)), "rk"), RankTooLargeError),
    "pickle bytes": (
        lambda w, b: w.add(b.write(), "pk", weights=pickle.dumps({"x": 1})),
        AdapterError,
    ),
    "store error": (_missing, ArtifactNotFoundError),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_failure_is_typed_and_leaves_nothing(world: World, builder, kit, case: str) -> None:  # type: ignore[no-untyped-def]
    make, error = CASES[case]
    builder.kit = kit
    key = make(world, builder)
    future = world.cache.acquire_future(key)
    world.executor.drain()
    with pytest.raises(error):
        future.result(timeout=0)
    world.cache.check_integrity()
    assert world.leftovers() == ([], set(), ())
    assert not any(lg.entries for lg in world.cache.ledgers.values())


@pytest.mark.parametrize("phase", range(7))
def test_cancellation_at_each_phase_undoes_it(world: World, builder, phase: int) -> None:  # type: ignore[no-untyped-def]
    key = world.add(builder.write(), "cancel")
    future = world.cache.acquire_future(key)
    for _ in range(phase):
        world.executor.step()
    finished = future.done()
    world.cache.cancel(key)
    world.executor.drain()
    world.cache.check_integrity()
    if not finished:
        with pytest.raises(LoadCancelledError):
            future.result(timeout=0)
        assert world.leftovers() == ([], set(), ())
    assert world.cache.snapshot().num_loading == 0


def test_a_victims_slot_is_replaced_in_place_and_free_rows_stay_zero(world: World, builder) -> None:  # type: ignore[no-untyped-def]
    configs = [
        default_config(),
        default_config(r=2, target_modules=["k_proj", "o_proj"]),
        default_config(r=3, target_modules=["up_proj"]),
    ]
    keys = [world.add(builder.write(c), f"a{i}") for i, c in enumerate(configs)]
    pool = world.pipeline.pool
    for step, key in enumerate(keys * 3):  # three adapters, two slots: later loads evict one
        future = world.cache.acquire_future(key)
        world.executor.drain()
        lease = future.result(timeout=0)
        lease.release()
        world.cache.check_integrity()
        pool.check_integrity()  # the replaced copy's rows are zero wherever the new one's aren't
        in_l0 = {e.slot: k.adapter_digest for k, e in world.cache.ledgers[Tier.L0].entries.items()}
        held = {s: info.digest for s in pool.occupied_slots() if (info := pool.slot_info(s))}
        assert held == in_l0 and len(held) == min(step + 1, 2)


def test_a_cancelled_replacement_leaves_its_slot_cleared(world: World, builder) -> None:  # type: ignore[no-untyped-def]
    first = world.add(builder.write(), "first")
    second = world.add(builder.write(default_config(r=2)), "second")
    for key in (first, second):
        held = world.cache.acquire_future(key)
        world.executor.drain()
        held.result(timeout=0).release()
    third = world.add(builder.write(default_config(r=3)), "third")
    future = world.cache.acquire_future(third)
    while not world.cache.ledgers[Tier.L0].get(third):  # until it owns a victim's slot
        assert world.executor.step()
    world.cache.cancel(third)
    world.executor.drain()
    with pytest.raises(LoadCancelledError):
        future.result(timeout=0)
    world.cache.check_integrity()
    world.pipeline.pool.check_integrity()
    slots = {e.slot for e in world.cache.ledgers[Tier.L0].entries.values()}
    assert set(world.pipeline.pool.occupied_slots()) == slots and len(slots) == 1
