"""Test fakes for the adapter cache: a LoadPipeline that records every side effect it would have,
with injectable failures, driven by the deterministic SimExecutor."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

from loraplex.artifacts.identity import AdapterKey
from loraplex.clock import ManualClock
from loraplex.residency.cache import CacheConfig, SimExecutor, TieredAdapterCache
from loraplex.residency.ledger import Tier, TierBudget
from loraplex.residency.pipeline import (
    CancelToken,
    Footprint,
    Move,
    Prepared,
    RecoveredCopy,
    Resolved,
)
from loraplex.residency.policy import EvictionPolicy, make_policy
from loraplex.residency.stats import Stage

BASE = hashlib.sha256(b"base").hexdigest()
UNIT = 100  # bytes of one adapter in every tier (slots are UNIT bytes too)


def key(tenant: str, name: str) -> AdapterKey:
    digest = hashlib.sha256(f"{tenant}/{name}".encode()).hexdigest()
    return AdapterKey(BASE, tenant, name, "r1", digest)


@dataclass
class FakePipeline:
    """Moves nothing; tracks staged payloads and installed copies; fails where told."""

    prepares_l0 = True  # it stages every move (failures injected at COPY in prepare too)
    sizes: dict[AdapterKey, int] = field(default_factory=dict)  # multiples of UNIT, default 1
    fail_at: dict[tuple[AdapterKey, Stage], Exception] = field(default_factory=dict)
    staged: set[tuple[AdapterKey, Tier]] = field(default_factory=set)
    installed: dict[Tier, set[AdapterKey]] = field(
        default_factory=lambda: {Tier.L0: set(), Tier.L1: set(), Tier.L2: set()}
    )
    slots: dict[int, AdapterKey] = field(default_factory=dict)
    resolves: int = 0
    resolved: list[AdapterKey] = field(default_factory=list)  # keys in resolve order
    fetches: int = 0
    survivors: list[RecoveredCopy] = field(default_factory=list)  # what recover() reports
    drops: list[tuple[Tier, AdapterKey]] = field(default_factory=list)  # drop() calls, in order
    # whether the cache holds a ready copy (make_rig sets it): a slot an install finds occupied
    # must hold a copy the cache evicted for it
    resident: Callable[[AdapterKey, Tier], bool] = lambda key, tier: False

    def _maybe_fail(self, key: AdapterKey, stage: Stage, cancel: CancelToken) -> None:
        cancel.check(stage)
        error = self.fail_at.get((key, stage))
        if error is not None:
            raise error

    def resolve(self, key: AdapterKey, cancel: CancelToken) -> Resolved:
        self._maybe_fail(key, Stage.RESOLVE, cancel)
        self.resolves += 1
        self.resolved.append(key)
        n = self.sizes.get(key, 1) * UNIT
        return Resolved(Footprint(UNIT, n, n), {Stage.RESOLVE: 0.001})

    def prepare(self, move: Move, cancel: CancelToken) -> Prepared:
        stage = {Tier.L2: Stage.FETCH, Tier.L1: Stage.READ, Tier.L0: Stage.COPY}[move.target]
        self._maybe_fail(move.key, stage, cancel)
        if move.target is Tier.L2:
            self.fetches += 1
            self._maybe_fail(move.key, Stage.VERIFY, cancel)
        self.staged.add((move.key, move.target))
        return Prepared((move.key, move.target), {stage: 0.01})

    def install(
        self, move: Move, prepared: Prepared, slot: int | None, cancel: CancelToken
    ) -> dict[Stage, float]:
        self.staged.discard((move.key, move.target))
        self.installed[move.target].add(move.key)
        if slot is not None:
            replaced = self.slots.get(slot)
            if replaced is not None:  # the copy the cache evicted for this load (no drop)
                if replaced == move.key or self.resident(replaced, Tier.L0):
                    raise AssertionError(f"slot {slot} already holds {replaced}")
                self.installed[Tier.L0].discard(replaced)
            self.slots[slot] = move.key
        stage = Stage.COPY if move.target is Tier.L0 else Stage.COMMIT
        self._maybe_fail(move.key, stage, cancel)
        return {stage: 0.001}

    def discard(self, move: Move, prepared: Prepared) -> None:
        self.staged.discard((move.key, move.target))

    def drop(self, tier: Tier, key: AdapterKey, slot: int | None) -> None:
        self.installed[tier].discard(key)
        self.drops.append((tier, key))
        if slot is not None:  # like the slot pool's clear: whatever the slot holds goes
            replaced = self.slots.pop(slot, None)
            if replaced is not None and replaced != key:
                self.installed[Tier.L0].discard(replaced)

    def recover(self) -> list[RecoveredCopy]:
        self.installed[Tier.L2].update(c.key for c in self.survivors)
        return list(self.survivors)


class NoL0Staging(FakePipeline):
    """Stages nothing for L0 (as the real pipeline): the cache must not ask it to."""

    prepares_l0 = False

    def prepare(self, move: Move, cancel: CancelToken) -> Prepared:
        assert move.target is not Tier.L0, "an L0 move was prepared"
        return super().prepare(move, cancel)


@dataclass
class Rig:
    """A cache on a fake pipeline, a manual clock and a deterministic executor."""

    cache: TieredAdapterCache
    pipeline: FakePipeline
    executor: SimExecutor
    clock: ManualClock

    def settle(self, seconds: float = 1.0) -> None:
        self.executor.run_until(self.clock.now() + seconds)

    def check(self) -> None:
        """check_integrity() plus: the pipeline's copies are exactly the ledgers' entries."""
        self.cache.check_integrity()
        for tier, keys in self.pipeline.installed.items():
            ledger = set(self.cache.ledgers[tier].entries)
            ready = {k for k, e in self.cache.ledgers[tier].entries.items() if e.ready}
            assert ready <= keys <= ledger, (tier, keys, ledger)
        # Staged bytes belong to a live load (prepared, or still in its prepare phase).
        loading = self.cache.snapshot().num_loading
        assert loading or not self.pipeline.staged, self.pipeline.staged


def budgets(
    slots: int = 3,
    l1: int = 5,
    l2: int = 8,
    tenant_l0: dict[str, int] | None = None,
    share: float = 1.0,
) -> dict[Tier, TierBudget]:
    return {
        Tier.L0: TierBudget(
            slots * UNIT, slots, tenant_max_bytes=tenant_l0 or {}, default_tenant_share=share
        ),
        Tier.L1: TierBudget(l1 * UNIT, default_tenant_share=share),
        Tier.L2: TierBudget(l2 * UNIT, default_tenant_share=share),
    }


def make_rig(
    policy: str | EvictionPolicy = "cost_aware",
    pipeline: FakePipeline | None = None,
    **config: object,
) -> Rig:
    clock = ManualClock()
    executor = SimExecutor(clock)
    pipeline = pipeline or FakePipeline()
    names = ("slots", "l1", "l2", "tenant_l0", "share")
    budget_args = {k: config.pop(k) for k in names if k in config}
    cfg = CacheConfig(budgets=budgets(**budget_args), **config)  # type: ignore[arg-type]
    chosen = make_policy(policy) if isinstance(policy, str) else policy
    cache = TieredAdapterCache(cfg, pipeline, policy=chosen, clock=clock, executor=executor)
    pipeline.resident = cache.is_resident
    return Rig(cache, pipeline, executor, clock)


def use(rig: Rig, adapter: AdapterKey, times: int = 1) -> None:
    """Acquires and releases ``adapter`` ``times`` times, one second apart, checking the cache's
    integrity after each."""
    for _ in range(times):
        future = rig.cache.acquire_future(adapter)
        rig.settle()
        future.result(timeout=0).release()
        rig.clock.advance(1.0)
        rig.check()
