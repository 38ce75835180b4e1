"""L2 across restarts: verified copies survive a new process, anything else is deleted, and the
survivors are accounted within the L2 budget (evicted by the policy when over)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from cache_kit import UNIT, key, make_rig

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.store import LocalArtifactStore
from loraplex.clock import ManualClock
from loraplex.model.lora import LoraSlotPool
from loraplex.residency.cache import CacheConfig, SimExecutor, TieredAdapterCache
from loraplex.residency.ledger import Tier, TierBudget
from loraplex.residency.pipeline import RecoveredCopy
from loraplex.runtime.disk_tier import SIDECAR_FILE, WEIGHTS_FILE
from loraplex.runtime.tier_backends import ArtifactRef, DiskTier, TierPipeline


@dataclass
class Worker:
    """One worker process's cache over a shared store and L2 directory."""

    cache: TieredAdapterCache
    disk: DiskTier
    executor: SimExecutor

    def acquire_source(self, key: AdapterKey) -> Tier:
        future = self.cache.acquire_future(key)
        self.executor.drain()
        lease = future.result(timeout=0)
        lease.release()
        self.cache.check_integrity()
        return lease.load.source


class Site:
    """A store and an L2 directory that outlive worker processes."""

    def __init__(self, tmp: Path, base: BaseModelSpec) -> None:
        self.base, self.l2 = base, tmp / "l2"
        self.store = LocalArtifactStore(tmp / "store")
        self.refs: dict[AdapterKey, ArtifactRef] = {}

    def add(self, adapter_dir: Path, name: str) -> AdapterKey:
        files = [adapter_dir / "adapter_config.json", adapter_dir / WEIGHTS_FILE]
        digests = [hashlib.sha256(p.read_bytes()).hexdigest() for p in files]
        for path, digest in zip(files, digests, strict=True):
            self.store.put_file(path, digest)
        key = AdapterKey(self.base.digest, "t", name, "r1", digests[1])
        size = sum(p.stat().st_size for p in files)
        self.refs[key] = ArtifactRef(digests[0], digests[1], size, 4 * size)
        return key

    def start(self, l2_bytes: int = 1 << 24) -> Worker:
        pool = LoraSlotPool(self.base, 2, 8, dtype=torch.float32, device=torch.device("cpu"))
        disk = DiskTier(self.l2)
        pipeline = TierPipeline(self.refs.__getitem__, self.store, disk, pool, self.base)
        budgets = {
            Tier.L0: TierBudget(2 * pool.bytes_per_slot, 2),
            Tier.L1: TierBudget(1 << 24),
            Tier.L2: TierBudget(l2_bytes),
        }
        clock = ManualClock()
        executor = SimExecutor(clock)
        cache = TieredAdapterCache(CacheConfig(budgets), pipeline, clock=clock, executor=executor)
        return Worker(cache, disk, executor)


@pytest.fixture
def site(tmp_path: Path, base: BaseModelSpec) -> Site:
    return Site(tmp_path, base)


def test_verified_copies_survive_a_restart(site: Site, builder) -> None:  # type: ignore[no-untyped-def]
    a, b = site.add(builder.write(), "a"), site.add(builder.write(), "b")
    first = site.start()
    assert first.acquire_source(a) is Tier.L3 and first.acquire_source(b) is Tier.L3
    first.cache.close()
    site.store.delete(a.adapter_digest)  # from now on, only the L2 copy can serve ``a``
    second = site.start()
    assert second.cache.recover() == []
    used = second.cache.ledgers[Tier.L2].used_bytes
    assert used == site.refs[a].disk_bytes + site.refs[b].disk_bytes
    assert second.acquire_source(a) is Tier.L2
    assert second.cache.snapshot().stats.misses == 0


def test_corrupt_and_leftover_files_are_dropped_not_served(site: Site, builder) -> None:  # type: ignore[no-untyped-def]
    good, bad = site.add(builder.write(), "good"), site.add(builder.write(), "bad")
    first = site.start()
    first.acquire_source(good)
    first.acquire_source(bad)
    weights = first.disk.path_for(bad) / WEIGHTS_FILE
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    leftover = first.disk.quarantine_dir()
    (leftover / WEIGHTS_FILE).write_bytes(b"half a download")
    (site.l2 / "stray.tmp").write_bytes(b"x")
    (site.l2 / ("0" * 64)).mkdir()  # a digest-named directory without a sidecar
    second = site.start()
    second.cache.recover()
    assert set(second.cache.ledgers[Tier.L2].entries) == {good}
    names = {p.relative_to(site.l2).parts[0] for p in second.disk.files()}
    assert names == {second.disk.path_for(good).name}
    assert sorted(p.name for p in site.l2.iterdir()) == sorted(
        [".quarantine", second.disk.path_for(good).name]
    )
    assert second.acquire_source(bad) is Tier.L3  # refetched and re-verified, never served
    assert second.acquire_source(good) is Tier.L2


def test_a_tampered_sidecar_cannot_relabel_a_copy(site: Site, builder) -> None:  # type: ignore[no-untyped-def]
    a = site.add(builder.write(), "a")
    first = site.start()
    first.acquire_source(a)
    sidecar = first.disk.path_for(a) / SIDECAR_FILE
    sidecar.write_text(sidecar.read_text().replace('"name": "a"', '"name": "z"'))
    second = site.start()
    assert second.cache.recover() == []
    assert not second.cache.ledgers[Tier.L2].entries and second.disk.files() == []


def test_survivors_over_budget_are_evicted_oldest_first(site: Site, builder) -> None:  # type: ignore[no-untyped-def]
    keys = [site.add(builder.write(), name) for name in ("old", "mid", "new")]
    first = site.start()
    for age, k in zip((300, 200, 100), keys, strict=True):
        first.acquire_source(k)
        stamp = first.disk.path_for(k) / SIDECAR_FILE
        mtime = stamp.stat().st_mtime - age
        os.utime(stamp, (mtime, mtime))
    room = site.refs[keys[1]].disk_bytes + site.refs[keys[2]].disk_bytes
    second = site.start(l2_bytes=room)
    assert second.cache.recover() == [keys[0]]
    assert set(second.cache.ledgers[Tier.L2].entries) == set(keys[1:])
    assert not second.disk.path_for(keys[0]).exists()
    second.cache.check_integrity()


@pytest.mark.parametrize("policy", ["lru", "cost_aware"])
def test_recovery_respects_budget_under_every_policy(policy: str) -> None:
    rig = make_rig(policy, l2=3)
    copies = [RecoveredCopy(key("t", f"c{i}"), UNIT, age_s=float(10 - i)) for i in range(5)]
    big = RecoveredCopy(key("t", "big"), 9 * UNIT, age_s=0.0)
    rig.pipeline.survivors = [*copies, big]
    dropped = rig.cache.recover()
    assert set(dropped) == {c.key for c in copies[:2]} | {big.key}
    assert set(rig.cache.ledgers[Tier.L2].entries) == {c.key for c in copies[2:]}
    assert rig.cache.snapshot().stats.resident_bytes[Tier.L2] == 3 * UNIT
    rig.check()
    future = rig.cache.acquire_future(copies[4].key)
    rig.settle()
    assert future.result(timeout=0).load.source is Tier.L2
