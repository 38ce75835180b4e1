"""The cache's seams for the engine and metrics (summary, residency deltas, capped snapshots),
I/O kept out of the cache lock, and the bound on per-key history."""

from __future__ import annotations

import threading

from cache_kit import UNIT, FakePipeline, key, make_rig

from loraplex.artifacts.identity import AdapterKey
from loraplex.errors import DigestMismatchError
from loraplex.residency.ledger import Tier
from loraplex.residency.pipeline import CancelToken, Move, Prepared
from loraplex.residency.stats import Stage

A, B, C = (key("t", n) for n in "abc")


def test_summary_counts_copies_bytes_and_loads() -> None:
    rig = make_rig(slots=3, l1=5, l2=8)
    rig.cache.acquire_future(A)
    loading = rig.cache.summary()
    assert loading.num_loading == 1 and loading.num_blocked == 0
    rig.settle()
    summary = rig.cache.summary()
    assert summary.num_loading == 0
    assert summary.num_copies == {Tier.L0: 1, Tier.L1: 1, Tier.L2: 1}
    assert summary.used_bytes == {Tier.L0: UNIT, Tier.L1: UNIT, Tier.L2: UNIT}
    assert summary.capacity_bytes == {Tier.L0: 3 * UNIT, Tier.L1: 5 * UNIT, Tier.L2: 8 * UNIT}
    assert summary.stats.misses == 1 and summary.stats.loads[Tier.L0] == 1
    rig.check()


def test_residency_changes_are_deltas_after_a_version_and_full_from_zero() -> None:
    rig = make_rig(slots=1)
    lease = rig.cache.acquire_future(A)
    rig.settle()
    first = rig.cache.residency_changes(0)
    assert first.full and first.tiers == {A: (Tier.L0, Tier.L1, Tier.L2)}
    assert rig.cache.residency_changes(first.version).tiers == {}  # nothing since
    lease.result(timeout=0).release()
    rig.cache.acquire_future(B)  # the one slot: A leaves L0 for B
    rig.settle()
    delta = rig.cache.residency_changes(first.version)
    assert not delta.full and delta.version > first.version
    assert delta.tiers == {A: (Tier.L1, Tier.L2), B: (Tier.L0, Tier.L1, Tier.L2)}
    for tier in (Tier.L1, Tier.L2):
        rig.cache.evict(A, tier)
    assert rig.cache.residency_changes(delta.version).tiers == {A: ()}  # resident nowhere
    rig.check()


def test_snapshot_top_lists_the_hottest_copies_only() -> None:
    rig = make_rig(slots=3)
    for k, hits in ((A, 1), (B, 3), (C, 2)):
        for _ in range(hits + 1):  # the first acquire is the miss that loads it
            future = rig.cache.acquire_future(k)
            rig.settle()
            future.result(timeout=0).release()
    top = rig.cache.snapshot(top=2)
    assert [(e.key, e.tier) for e in top.entries] == [(B, Tier.L0), (C, Tier.L0)]
    assert len(rig.cache.snapshot().entries) == 9  # three keys in three tiers
    rig.check()


class _BlockingDrop(FakePipeline):
    """A drop that waits like an L0 slot clear waits for the engine's slot lock."""

    def __init__(self) -> None:
        super().__init__()
        self.slot_lock_free = threading.Event()
        self.dropping = threading.Event()

    def drop(self, tier: Tier, key: AdapterKey, slot: int | None) -> None:
        self.dropping.set()
        self.slot_lock_free.wait(timeout=10)
        super().drop(tier, key, slot)


def test_an_eviction_waiting_for_the_slot_lock_does_not_block_other_cache_calls() -> None:
    pipeline = _BlockingDrop()
    rig = make_rig(pipeline=pipeline, slots=2)
    for k in (A, B):
        future = rig.cache.acquire_future(k)
        rig.settle()
        future.result(timeout=0).release()
    evicting = threading.Thread(target=rig.cache.evict, args=(A, Tier.L0))
    evicting.start()
    assert pipeline.dropping.wait(timeout=10)
    answers: list[object] = []

    def other_call() -> None:
        answers.append(rig.cache.acquire_future(B).result(timeout=0))  # an L0 hit
        answers.append(rig.cache.summary())

    other = threading.Thread(target=other_call)
    other.start()
    other.join(timeout=10)
    blocked = other.is_alive()
    pipeline.slot_lock_free.set()
    evicting.join(timeout=10)
    other.join(timeout=10)
    assert not blocked and len(answers) == 2
    assert not rig.cache.is_resident(A, Tier.L0) and A not in pipeline.installed[Tier.L0]
    rig.check()


def _loads_of(rig: object, k: AdapterKey) -> int:
    snapshot = rig.cache.snapshot()  # type: ignore[attr-defined]
    return next(e.loads for e in snapshot.entries if e.key == k and e.tier is Tier.L0)


def _churn(rig: object, keys: list[AdapterKey]) -> None:
    for k in keys:
        future = rig.cache.acquire_future(k)  # type: ignore[attr-defined]
        rig.settle()  # type: ignore[attr-defined]
        future.result(timeout=0).release()


def test_history_of_keys_without_copies_is_bounded() -> None:
    others = [key("u", f"o{i}") for i in range(6)]
    for bound, expected_loads in ((100, 2), (2, 1)):
        rig = make_rig(slots=1, l1=1, l2=1, max_idle_keys=bound)
        _churn(rig, [A, *others, A])  # A loses every copy, then six keys churn past it
        assert _loads_of(rig, A) == expected_loads  # forgotten beyond the bound: counts restart
        rig.check()


def test_a_victims_slot_handed_to_its_replacement_is_not_cleared_first() -> None:
    rig = make_rig(slots=1)
    first = rig.cache.acquire_future(A)
    rig.settle()
    slot = first.result(timeout=0).slot
    first.result(timeout=0).release()
    rig.cache.acquire_future(B)  # the one slot: A's copy is replaced by B's install
    rig.settle()
    rig.check()
    assert (Tier.L0, A) not in rig.pipeline.drops  # one pool write for the slot, not two
    assert rig.pipeline.slots == {slot: B} and rig.pipeline.installed[Tier.L0] == {B}
    assert not rig.cache.is_resident(A, Tier.L0) and rig.cache.is_resident(A, Tier.L1)


class _FailingInstall(FakePipeline):
    """Fails every L0 install of B before writing anything (as the slot pool's load does)."""

    def install(
        self, move: Move, prepared: Prepared, slot: int | None, cancel: CancelToken
    ) -> dict[Stage, float]:
        if move.target is Tier.L0 and move.key == B:
            raise DigestMismatchError("adapter", "0" * 64, "1" * 64)
        return super().install(move, prepared, slot, cancel)


def test_a_replacement_that_fails_to_install_leaves_the_slot_cleared() -> None:
    rig = make_rig(pipeline=_FailingInstall(), slots=1)
    first = rig.cache.acquire_future(A)
    rig.settle()
    first.result(timeout=0).release()
    failing = rig.cache.acquire_future(B)  # evicts A, then B's install fails
    rig.settle()
    assert isinstance(failing.exception(timeout=0), DigestMismatchError)
    rig.check()
    assert rig.pipeline.slots == {} and rig.pipeline.installed[Tier.L0] == set()
    assert rig.cache.residency(Tier.L0) == [] and (Tier.L0, B) in rig.pipeline.drops
