"""A release never releases the revision its alias left while that revision is merged into the
engine's base weights (docs/modes.md): it waits, tick after tick, until it is unmerged."""

from __future__ import annotations

from conftest import FakeEnv

from loraplex.clock import ManualClock
from loraplex.registry import Registry
from loraplex.release.controller import ReleaseController
from loraplex.release.model import ReleasePlan, ReleaseState, Thresholds
from loraplex.release.store import ReleaseStore

S = ReleaseState
PLAN = ReleasePlan(ladder=(0.1, 0.5), dwell_s=60.0, window_s=600.0, thresholds=Thresholds())


def _to_canary(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> tuple[ReleaseStore, ReleaseController]:
    store = ReleaseStore(registry)
    store.start_release("acme", "bot", "v2", PLAN, actor="ops")
    controller = ReleaseController(registry, env, clock, actor="controller")
    for _ in range(3):  # staged -> prewarming -> probing -> canary
        controller.tick()
    assert store.latest_release("acme", "bot").state is S.CANARY
    return store, controller


def test_a_promoted_release_keeps_a_merged_old_revision_until_it_is_unmerged(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    store, controller = _to_canary(registry, env, clock)
    env.merged = {"v1"}  # the baseline is in the base weights
    hold_until = store.promote("acme", "bot", actor="ops").hold_until
    assert hold_until is not None
    clock.advance(hold_until - clock.now() + 1.0)
    for _ in range(3):
        controller.tick()
        assert env.pinned == {"v1"}  # held past its window: still merged
        assert store.latest_release("acme", "bot").hold_until == hold_until
    env.merged = set()  # unmerged
    controller.tick()
    assert env.pinned == set()
    assert store.latest_release("acme", "bot").hold_until is None


def test_a_rolled_back_merged_candidate_is_released_only_once_unmerged(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    store, controller = _to_canary(registry, env, clock)
    env.merged = {"v2"}  # auto merged the candidate during its canary
    hold_until = store.rollback("acme", "bot", actor="ops").hold_until
    assert hold_until is not None
    clock.advance(hold_until - clock.now() + 1.0)
    for _ in range(3):
        controller.tick()
        assert "v2" in env.pinned  # the alias left it, but it is still merged
        assert store.latest_release("acme", "bot").hold_until is not None  # ticks keep coming
    env.merged = set()
    controller.tick()
    assert env.pinned == set()
    assert store.latest_release("acme", "bot").hold_until is None


def test_a_merged_promoted_candidate_does_not_hold_back_the_baseline(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    store, controller = _to_canary(registry, env, clock)
    env.merged = {"v2"}  # the new live revision is merged: nothing left it
    hold_until = store.promote("acme", "bot", actor="ops").hold_until
    assert hold_until is not None
    clock.advance(hold_until - clock.now() + 1.0)
    controller.tick()
    assert env.pinned == set()
    assert store.latest_release("acme", "bot").hold_until is None
