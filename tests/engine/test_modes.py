"""Transitions through the real engine: requests in flight across a merge and an unmerge get the
greedy tokens they get unmerged, token for token; a merged revision stays in its slot while other
adapters cycle through the cache; transitions are measured and reported."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loraplex.clock import MonotonicClock
from loraplex.demo.assets import DemoAssets
from loraplex.engine.modes import ModeSwitcher, Transition, TransitionKind
from loraplex.engine.offline import OfflineConfig, OfflineEngine, OfflineRequest
from loraplex.model.merge import MergedLoraApplier, MergeStateError
from loraplex.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(demo_assets: DemoAssets) -> Iterator[OfflineEngine]:
    config = OfflineConfig(max_loras=2, max_lora_rank=64)
    with OfflineEngine(demo_assets.base_model_dir, config) as offline:
        yield offline


def requests(demo_assets: DemoAssets) -> list[OfflineRequest]:
    hot = demo_assets.adapter("acme", "billing", "r1")
    other = demo_assets.adapter("globex", "codegen", "r1")
    return [
        OfflineRequest(hot.probe_prompt, hot.path, GREEDY),
        OfflineRequest(other.probe_prompt, other.path, GREEDY),
        OfflineRequest(hot.probe_prompt, None, GREEDY),
        OfflineRequest(other.probe_prompt, hot.path, GREEDY),
    ]


@pytest.mark.parametrize(("merge_at", "unmerge_at"), [(0, None), (3, 8), (5, None), (0, 2)])
def test_greedy_tokens_are_identical_across_transitions(
    engine: OfflineEngine, demo_assets: DemoAssets, merge_at: int, unmerge_at: int | None
) -> None:
    batch = requests(demo_assets)
    want = [r.token_ids for r in engine.generate(batch)]
    seen: list[Transition] = []
    runtime = engine.runtime
    switcher = ModeSwitcher(engine.core.runner, runtime.pool, MonotonicClock(), seen.append)
    hot_key = engine.adapter_key(demo_assets.adapter("acme", "billing", "r1").path)

    def between_steps(step: int) -> None:
        if step == merge_at:
            switcher.merge("acme/billing@r1", runtime.cache.acquire_future(hot_key).result(60))
            assert isinstance(engine.core.runner.lora, MergedLoraApplier)
        if step == unmerge_at:
            switcher.unmerge()

    got = [r.token_ids for r in engine.generate(batch, between_steps)]
    if switcher.merged_revision is not None:
        switcher.unmerge()
    assert got == want
    assert [t.kind for t in seen] == [TransitionKind.MERGE, TransitionKind.UNMERGE]
    assert all(t.seconds >= 0 and t.revision == "acme/billing@r1" for t in seen)
    assert engine.core.runner.lora is runtime.pool
    runtime.pool.check_integrity()
    runtime.cache.check_integrity()


def test_a_merged_revision_keeps_its_slot_while_others_cycle(
    engine: OfflineEngine, demo_assets: DemoAssets
) -> None:
    runtime = engine.runtime
    switcher = ModeSwitcher(engine.core.runner, runtime.pool, MonotonicClock())
    hot = demo_assets.adapter("acme", "billing", "r1")
    lease = runtime.cache.acquire_future(engine.adapter_key(hot.path)).result(60)
    slot, digest = lease.slot, runtime.pool.slot_info(lease.slot)
    switcher.merge("acme/billing@r1", lease)
    assert switcher.is_pinned("acme/billing@r1")
    others = [a for a in demo_assets.adapters if a.ref != hot.ref][:4]
    for adapter in others:  # one free slot: every one of them evicts the one before
        engine.generate([OfflineRequest(adapter.probe_prompt, adapter.path, GREEDY)])
        assert runtime.pool.slot_info(slot) == digest
    with pytest.raises(MergeStateError, match="expected an unmerge"):
        switcher.merge("x@1", runtime.cache.acquire_future(engine.adapter_key(hot.path)).result(60))
    switcher.unmerge()
    assert not switcher.is_pinned("acme/billing@r1")
    with pytest.raises(MergeStateError, match="nothing is merged"):
        switcher.unmerge()
    runtime.cache.check_integrity()
