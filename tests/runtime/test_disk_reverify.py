"""An L2 copy is hashed against the registry's record before it is read: a copy whose config and
sidecar were both edited (consistent with each other, so recovery accepts it) is dropped and
replaced from the artifact store, and the slot serves the registered revision. A hostile file
in L2 costs a restart its length prefix, not a parse, and is dropped with a log line."""

from __future__ import annotations

import hashlib
import json
import logging
import struct
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.store import LocalArtifactStore
from loraplex.artifacts.validate import validate_adapter_dir
from loraplex.clock import ManualClock
from loraplex.errors import ArtifactNotFoundError
from loraplex.model.adapter_weights import load_adapter_weights
from loraplex.model.lora import LoraSlotPool
from loraplex.residency.cache import CacheConfig, SimExecutor, TieredAdapterCache
from loraplex.residency.ledger import Tier, TierBudget
from loraplex.runtime.disk_tier import CONFIG_FILE, SIDECAR_FILE, WEIGHTS_FILE
from loraplex.runtime.tier_backends import ArtifactRef, DiskTier, TierPipeline

MAX_RANK = 8


@dataclass
class Worker:
    """One worker process: a cache over the shared store and L2 directory."""

    cache: TieredAdapterCache
    pipeline: TierPipeline
    executor: SimExecutor

    def acquire(self, key: AdapterKey) -> tuple[Tier, int]:
        """Loads ``key`` into a slot; the tier it came from and the slot."""
        future = self.cache.acquire_future(key)
        self.executor.drain()
        lease = future.result(timeout=0)
        lease.release()
        self.cache.check_integrity()
        return lease.load.source, lease.slot


class Site:
    """A store (L3, the registry's record) and an L2 directory that outlive workers."""

    def __init__(self, tmp: Path, base: BaseModelSpec) -> None:
        self.base, self.l2 = base, tmp / "l2"
        self.store = LocalArtifactStore(tmp / "store")
        self.refs: dict[AdapterKey, ArtifactRef] = {}

    def add(self, adapter_dir: Path) -> AdapterKey:
        files = [adapter_dir / CONFIG_FILE, adapter_dir / WEIGHTS_FILE]
        digests = [hashlib.sha256(p.read_bytes()).hexdigest() for p in files]
        for path, digest in zip(files, digests, strict=True):
            self.store.put_file(path, digest)
        key = AdapterKey(self.base.digest, "t", "a", "r1", digests[1])
        size = sum(p.stat().st_size for p in files)
        self.refs[key] = ArtifactRef(digests[0], digests[1], size, 4 * size)
        return key

    def start(self) -> Worker:
        pool = LoraSlotPool(self.base, 2, MAX_RANK, dtype=torch.float32, device=torch.device("cpu"))
        pipeline = TierPipeline(
            self.refs.__getitem__, self.store, DiskTier(self.l2), pool, self.base
        )
        budgets = {
            Tier.L0: TierBudget(2 * pool.bytes_per_slot, 2),
            Tier.L1: TierBudget(1 << 24),
            Tier.L2: TierBudget(1 << 24),
        }
        clock = ManualClock()
        executor = SimExecutor(clock)
        cache = TieredAdapterCache(CacheConfig(budgets), pipeline, clock=clock, executor=executor)
        return Worker(cache, pipeline, executor)


@pytest.fixture
def site(tmp_path: Path, base: BaseModelSpec) -> Site:
    return Site(tmp_path, base)


def tamper(copy_dir: Path, **config_changes: object) -> None:
    """Edits the copy's config and rewrites its sidecar to agree (what recovery checks)."""
    config = json.loads((copy_dir / CONFIG_FILE).read_text())
    config.update(config_changes)
    edited = json.dumps(config).encode()
    (copy_dir / CONFIG_FILE).write_bytes(edited)
    sidecar = json.loads((copy_dir / SIDECAR_FILE).read_text())
    sidecar["config_digest"] = hashlib.sha256(edited).hexdigest()
    (copy_dir / SIDECAR_FILE).write_text(json.dumps(sidecar, sort_keys=True))


def assert_serves_registered(worker: Worker, adapter_dir: Path, base: BaseModelSpec) -> None:
    """L1 and the slot hold exactly what the registered files give (weights and scales)."""
    key = next(iter(worker.cache.ledgers[Tier.L0].entries))
    true = load_adapter_weights(
        validate_adapter_dir(adapter_dir, base, MAX_RANK), dtype=torch.float32
    )
    held = worker.pipeline.memory.get(key)
    slot = worker.cache.ledgers[Tier.L0].entries[key].slot
    assert slot is not None
    for want, got in zip(true.modules, held.modules, strict=True):
        assert (got.layer, got.module, got.scale) == (want.layer, want.module, want.scale)
        assert torch.equal(got.lora_a, want.lora_a) and torch.equal(got.lora_b, want.lora_b)
        rows = worker.pipeline.pool.module_weights(want.layer, want.module).slots[slot]
        assert rows.scale == want.scale


def test_a_copy_edited_with_its_sidecar_is_replaced_after_a_restart(
    site: Site, builder, base: BaseModelSpec, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    adapter_dir = builder.write()  # lora_alpha 8, r 4: scale 2
    key = site.add(adapter_dir)
    first = site.start()
    assert first.acquire(key)[0] is Tier.L3
    first.cache.close()
    copy_dir = first.pipeline.disk.path_for(key)
    tamper(copy_dir, lora_alpha=800)  # same tensors, scale 200: wrong output, right label
    second = site.start()
    assert second.cache.recover() == []  # consistent with its own sidecar: adopted into L2
    with caplog.at_level(logging.WARNING, logger="loraplex.runtime.tier_backends"):
        second.acquire(key)
    assert_serves_registered(second, adapter_dir, base)
    assert (copy_dir / CONFIG_FILE).read_bytes() == (adapter_dir / CONFIG_FILE).read_bytes()
    assert "dropped, refetching from the artifact store" in caplog.text
    assert key.ref in caplog.text


def test_a_copy_edited_while_serving_is_replaced_before_its_next_read(
    site: Site, builder, base: BaseModelSpec
) -> None:  # type: ignore[no-untyped-def]
    adapter_dir = builder.write()
    key = site.add(adapter_dir)
    worker = site.start()
    worker.acquire(key)
    assert worker.cache.evict(key, Tier.L0) and worker.cache.evict(key, Tier.L1)
    copy_dir = worker.pipeline.disk.path_for(key)
    tamper(copy_dir, lora_alpha=800)
    assert worker.acquire(key)[0] is Tier.L2
    assert_serves_registered(worker, adapter_dir, base)
    assert (copy_dir / CONFIG_FILE).read_bytes() == (adapter_dir / CONFIG_FILE).read_bytes()


def test_a_tampered_copy_is_never_read_even_when_the_store_cannot_replace_it(
    site: Site, builder
) -> None:  # type: ignore[no-untyped-def]
    key = site.add(builder.write())
    worker = site.start()
    worker.acquire(key)
    assert worker.cache.evict(key, Tier.L0) and worker.cache.evict(key, Tier.L1)
    tamper(worker.pipeline.disk.path_for(key), lora_alpha=800)
    site.store.delete(site.refs[key].config_digest)
    future = worker.cache.acquire_future(key)
    worker.executor.drain()
    with pytest.raises(ArtifactNotFoundError):
        future.result(timeout=0)
    worker.cache.check_integrity()
    assert worker.pipeline.memory.keys() == set()
    assert not worker.pipeline.disk.path_for(key).exists()


def test_a_hostile_cached_header_costs_a_restart_its_prefix_and_a_log_line(
    site: Site, builder, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    key = site.add(builder.write())
    first = site.start()
    first.acquire(key)
    first.cache.close()
    weights = first.pipeline.disk.path_for(key) / WEIGHTS_FILE
    with weights.open("r+b") as handle:  # a 100 MB header, really there (sparse)
        handle.write(struct.pack("<Q", 100_000_000))
        handle.truncate(8 + 100_000_000)
    second = site.start()
    with caplog.at_level(logging.WARNING, logger="loraplex.runtime.disk_tier"):
        assert second.cache.recover() == []
    assert not second.cache.ledgers[Tier.L2].entries
    assert second.pipeline.disk.files() == []
    assert "dropping" in caplog.text and "header length 100000000" in caplog.text
    assert second.acquire(key)[0] is Tier.L3
