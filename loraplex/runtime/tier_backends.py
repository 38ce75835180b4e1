"""The real tiers and the pipeline that moves adapters between them (imports torch).

L3 is the registry's ``ArtifactStore`` (objects by sha256). L2 (``disk_tier.DiskTier``) is a
directory of verified PEFT directories, one per adapter key, entered only by an atomic rename
out of quarantine after validation, re-verified when a restarted worker adopts it, and hashed
against the registry's record before every read (a copy that differs is replaced from L3). L1 holds
``AdapterWeights`` (CPU tensors, page-locked when CUDA is present). L0 is the model's
``LoraSlotPool``. Each stage is timed; every error is a domain error.

NOTE: ``LoraSlotPool.load`` runs on a cache worker thread; the engine must not run a forward
through a slot the cache is filling (it never does: a slot is filled before any lease on it
exists), but the pool's views are rebuilt on load, so pass ``slot_lock`` when the engine
steps concurrently and take the same lock around its forward.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.signature import check_stored_bundle
from loraplex.artifacts.store import ArtifactStore, fetch_to_file
from loraplex.artifacts.validate import ValidatedAdapter, validate_adapter_dir
from loraplex.errors import BaseModelMismatchError, DigestMismatchError
from loraplex.model.adapter_weights import AdapterWeights, load_adapter_weights
from loraplex.model.lora import LoraSlotPool
from loraplex.residency.ledger import Tier
from loraplex.residency.pipeline import (
    CancelToken,
    Footprint,
    Move,
    Prepared,
    RecoveredCopy,
    Resolved,
)
from loraplex.residency.stats import Stage
from loraplex.runtime.disk_tier import CONFIG_FILE, WEIGHTS_FILE, DiskTier

__all__ = ["ArtifactRef", "DiskTier", "MemoryTier", "TierPipeline"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ArtifactRef:
    """Where an adapter revision's files are in the artifact store, and what it weighs."""

    config_digest: str  # sha256 of adapter_config.json
    weights_digest: str  # sha256 of adapter_model.safetensors (the key's adapter_digest)
    disk_bytes: int  # both files together
    memory_bytes: int  # tensor bytes in the serving dtype
    signature_digest: str | None = None  # the stored model-signing bundle; None when unsigned


class MemoryTier:
    """L1: adapter weights in host memory."""

    def __init__(self) -> None:
        self._weights: dict[AdapterKey, AdapterWeights] = {}
        self._lock = threading.Lock()

    def put(self, key: AdapterKey, weights: AdapterWeights) -> None:
        with self._lock:
            self._weights[key] = weights

    def get(self, key: AdapterKey) -> AdapterWeights:
        with self._lock:
            return self._weights[key]

    def remove(self, key: AdapterKey) -> None:
        with self._lock:
            self._weights.pop(key, None)

    def keys(self) -> set[AdapterKey]:
        with self._lock:
            return set(self._weights)


@dataclass(frozen=True)
class _StagedDir:
    path: Path  # quarantine directory holding both files
    validated: ValidatedAdapter  # what verify found


class TierPipeline:
    """The cache's LoadPipeline over the real tiers."""

    prepares_l0 = False  # an L1 -> L0 move is one copy, at install

    def __init__(
        self,
        resolver: Callable[[AdapterKey], ArtifactRef],
        store: ArtifactStore,
        disk: DiskTier,
        pool: LoraSlotPool,
        base: BaseModelSpec,
        *,
        slot_lock: threading.Lock | None = None,
    ) -> None:
        self.resolver, self.store, self.disk, self.pool, self.base = (
            resolver,
            store,
            disk,
            pool,
            base,
        )
        self.memory = MemoryTier()
        self._slot_lock = slot_lock or threading.Lock()
        self._pin_memory = torch.cuda.is_available()

    def resolve(self, key: AdapterKey, cancel: CancelToken) -> Resolved:
        cancel.check(Stage.RESOLVE)
        start = time.perf_counter()
        ref = self.resolver(key)
        if ref.weights_digest != key.adapter_digest:
            raise DigestMismatchError(f"{key.ref} artifact", key.adapter_digest, ref.weights_digest)
        footprint = Footprint(self.pool.bytes_per_slot, ref.memory_bytes, ref.disk_bytes)
        return Resolved(footprint, {Stage.RESOLVE: time.perf_counter() - start})

    def prepare(self, move: Move, cancel: CancelToken) -> Prepared:
        if move.target is Tier.L2:
            return Prepared(*self._fetch_and_verify(move.key, cancel))
        if move.target is Tier.L1:
            cancel.check(Stage.READ)
            start = time.perf_counter()
            validated = self._recorded_disk_copy(move.key, cancel)
            weights = load_adapter_weights(
                validated, dtype=self.pool.dtype, pin_memory=self._pin_memory
            )
            return Prepared(weights, {Stage.READ: time.perf_counter() - start})
        return Prepared(None, {})

    def install(
        self, move: Move, prepared: Prepared, slot: int | None, cancel: CancelToken
    ) -> dict[Stage, float]:
        start = time.perf_counter()
        if move.target is Tier.L2:
            assert isinstance(prepared.payload, _StagedDir)
            self.disk.commit(move.key, prepared.payload.path, prepared.payload.validated)
            return {Stage.COMMIT: time.perf_counter() - start}
        if move.target is Tier.L1:
            assert isinstance(prepared.payload, AdapterWeights)
            self.memory.put(move.key, prepared.payload)
            return {}
        cancel.check(Stage.COPY)
        if slot is None:
            raise ValueError("an L0 install needs a slot")
        with self._slot_lock:
            self.pool.load(slot, self.memory.get(move.key))
            if self.pool.device.type == "cuda":
                torch.cuda.synchronize(self.pool.device)
        return {Stage.COPY: time.perf_counter() - start}

    def discard(self, move: Move, prepared: Prepared) -> None:
        if isinstance(prepared.payload, _StagedDir):
            shutil.rmtree(prepared.payload.path, ignore_errors=True)

    def drop(self, tier: Tier, key: AdapterKey, slot: int | None) -> None:
        if tier is Tier.L0 and slot is not None:
            with self._slot_lock:
                self.pool.clear(slot)
        elif tier is Tier.L1:
            self.memory.remove(key)
        elif tier is Tier.L2:
            self.disk.remove(key)

    def recover(self) -> list[RecoveredCopy]:
        return self.disk.recover(self.base, self.pool.max_lora_rank)

    def _recorded_disk_copy(self, key: AdapterKey, cancel: CancelToken) -> ValidatedAdapter:
        """The L2 copy of ``key`` once its files hash to the registry's record of the revision.

        NOTE: recovery checks a copy against its own sidecar, which sits on the same disk; a copy
        whose config and sidecar were both edited passes that, so every read re-checks here. A
        copy that differs is dropped and replaced from the artifact store (L3) before use.
        """
        problem = self.disk.differs_from_record(key, self.resolver(key).config_digest)
        if problem is not None:
            _log.warning(
                "L2 copy of %s %s: dropped, refetching from the artifact store", key.ref, problem
            )
            self.disk.remove(key)
            staged, _ = self._fetch_and_verify(key, cancel)
            self.disk.commit(key, staged.path, staged.validated)
        return self.disk.validated(key)

    def _fetch_and_verify(
        self, key: AdapterKey, cancel: CancelToken
    ) -> tuple[_StagedDir, dict[Stage, float]]:
        """Both files from the store into quarantine, validated; with the stage durations."""
        cancel.check(Stage.FETCH)
        staged = self.disk.quarantine_dir()
        try:
            start = time.perf_counter()
            ref = self.resolver(key)
            if ref.signature_digest is not None:  # the bundle must sign exactly these objects
                expected = {CONFIG_FILE: ref.config_digest, WEIGHTS_FILE: ref.weights_digest}
                check_stored_bundle(self.store, ref.signature_digest, expected, key.ref)
            fetch_to_file(self.store, ref.config_digest, staged / CONFIG_FILE)
            fetch_to_file(self.store, ref.weights_digest, staged / WEIGHTS_FILE)
            fetched = time.perf_counter()
            cancel.check(Stage.VERIFY)
            validated = validate_adapter_dir(staged, self.base, self.pool.max_lora_rank)
            if validated.digest != key.adapter_digest:
                raise DigestMismatchError(
                    f"{key.ref} weights", key.adapter_digest, validated.digest
                )
            if key.base_digest != self.base.digest:
                raise BaseModelMismatchError(
                    f"{key.ref} is keyed to base {key.base_digest}; serving {self.base.digest}"
                )
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        seconds = {Stage.FETCH: fetched - start, Stage.VERIFY: time.perf_counter() - fetched}
        return _StagedDir(staged, validated), seconds
