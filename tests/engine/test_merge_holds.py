"""Merge holds close the admin guard's check-then-act window (docs/modes.md): a revision held
by an admin action is never merged, a hold answers a merge that landed first, and a merge
attempted between the guard's check and its registry change is refused, deterministically; a
fleet's dedication (the same object) makes ``auto`` merge the dedicated revision."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loraplex.clock import ManualClock
from loraplex.demo.assets import DemoAssets
from loraplex.engine.merge_holds import MergeHolds
from loraplex.engine.mode_control import ModeController, ref_of
from loraplex.engine.mode_policy import ModePolicyConfig, ModeSetting
from loraplex.engine.modes import ModeSwitcher
from loraplex.engine.offline import OfflineConfig, OfflineEngine, OfflineRequest
from loraplex.engine.protocol import EngineLoad
from loraplex.errors import MergedRevisionError
from loraplex.sampling import SamplingParams
from loraplex.server.merge_guard import guarded

GREEDY = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


def test_a_hold_answers_the_merge_and_blocks_the_next_one() -> None:
    holds = MergeHolds()
    assert holds.merge_if_free("acme/a@r1", lambda: "merged") == "merged"
    assert holds.hold(frozenset({"acme/a@r1", "acme/b@r1"})) == {"acme/a@r1"}
    holds.unmerged()
    holds.hold(frozenset({"acme/b@r1"}))  # a second, nested hold on b
    assert holds.merge_if_free("acme/b@r1", lambda: "merged") is None
    holds.release(frozenset({"acme/a@r1", "acme/b@r1"}))
    assert holds.is_held("acme/b@r1") and not holds.is_held("acme/a@r1")
    assert holds.merge_if_free("acme/b@r1", lambda: "merged") is None
    holds.release(frozenset({"acme/b@r1"}))
    holds.release(frozenset({"acme/b@r1"}))  # one too many: the count stays at zero
    assert holds.merge_if_free("acme/b@r1", lambda: "merged") == "merged"
    assert not holds.is_held("acme/b@r1")


class Published:
    """The ``EngineClient`` surface the guard reads: the controller's published mode report."""

    def __init__(self, control: ModeController) -> None:
        self.control = control

    def load_snapshot(self) -> EngineLoad:
        return EngineLoad(0, 0, 0, 0.0, (), (), 3, 0, mode=self.control.report)


@pytest.fixture
def engine(demo_assets: DemoAssets) -> Iterator[OfflineEngine]:
    with OfflineEngine(demo_assets.base_model_dir, OfflineConfig(max_loras=3)) as offline:
        yield offline


def test_a_merge_between_the_check_and_the_change_is_refused(
    engine: OfflineEngine, demo_assets: DemoAssets
) -> None:
    hot = demo_assets.adapter("acme", "support", "r1")
    ref = ref_of(engine.adapter_key(hot.path))
    requests = [OfflineRequest(hot.probe_prompt, hot.path, GREEDY)]
    want = [r.token_ids for r in engine.generate(requests)]  # unmerged
    clock = ManualClock()
    holds = engine.runtime.merge_holds
    switcher = ModeSwitcher(engine.core.runner, engine.runtime.pool, clock, holds=holds)
    control = ModeController(ModeSetting.parse(f"merged:{ref}"), switcher,
                             engine.runtime.cache, clock)  # fmt: skip
    engine.core.modes = control
    published: object = Published(control)
    with guarded(published, holds, (ref,), "deprecated"):  # type: ignore[arg-type]
        # the check passed; the engine steps and asks to merge before the change is made
        assert [r.token_ids for r in engine.generate(requests)] == want
        assert switcher.merged_revision is None
    assert not holds.is_held(ref)
    assert [r.token_ids for r in engine.generate(requests)] == want  # released: it merges now
    assert switcher.merged_revision == ref
    with pytest.raises(MergedRevisionError), guarded(published, holds, (ref,), "deprecated"):  # type: ignore[arg-type]
        raise AssertionError("the change must not run while the revision is merged")
    assert not holds.is_held(ref)
    control.close()
    engine.runtime.cache.check_integrity()


def test_a_fleet_dedication_overrides_auto_until_it_is_given_back(
    engine: OfflineEngine, demo_assets: DemoAssets
) -> None:
    hot = demo_assets.adapter("acme", "support", "r1")
    cold = demo_assets.adapter("globex", "codegen", "r1")
    mixed = [OfflineRequest(hot.probe_prompt, hot.path, GREEDY)] + [
        OfflineRequest(cold.probe_prompt, cold.path, GREEDY)
    ] * 2  # the hot revision has a third of the tokens: auto alone would not merge it
    want = [r.token_ids for r in engine.generate(mixed)]
    ref = ref_of(engine.adapter_key(hot.path))
    clock = ManualClock()
    holds = engine.runtime.merge_holds
    switcher = ModeSwitcher(engine.core.runner, engine.runtime.pool, clock, holds=holds)
    # a tiny model's few tokens: ``min_window_tokens`` has its own tests (test_mode_policy.py)
    policy = ModePolicyConfig(window_s=5.0, min_dwell_s=3.0, payback_s=10.0, min_window_tokens=1)
    control = ModeController(ModeSetting.parse("auto"), switcher, engine.runtime.cache, clock,
                             policy=policy, lora_s_per_token=1e-3)  # fmt: skip
    engine.core.modes = control

    def tick(_step: int) -> None:
        clock.advance(1.0)

    holds.dedicate(ref)  # what FleetMergeHolds.dedicate asks of a replica
    assert [r.token_ids for r in engine.generate(mixed, tick)] == want
    assert switcher.merged_revision == ref
    holds.dedicate(None)  # given back: auto decides alone, and the hot share is low
    clock.advance(policy.window_s)
    assert [r.token_ids for r in engine.generate(mixed, tick)] == want
    assert switcher.merged_revision != ref
    control.close()
    engine.runtime.cache.check_integrity()
