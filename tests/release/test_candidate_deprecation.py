"""Deprecating a revision of a live release (docs/releases.md "A release's revisions").

Before the fix the registry took it: resolution skips a deprecated candidate, so the callers drawn
onto it went back to stable without a word while the release stayed in ``canary``, its controller
judging a candidate nobody was sent to; a deprecated baseline left every caller outside the
canary a 404. Now the registry refuses both, naming the release, as it refuses moving an alias a
release owns; once the release is over the deprecation goes through.
"""

from __future__ import annotations

import pytest
from conftest import FakeEnv
from test_controller import PLAN, _served, _to_canary

from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.clock import ManualClock
from loraplex.errors import RegistryError
from loraplex.registry import AliasTarget, Registry, RevisionState
from loraplex.release.errors import ReleaseStartError
from loraplex.release.model import ReleaseState
from loraplex.release.store import ReleaseStore

S = ReleaseState


def _state(registry: Registry, revision: str) -> RevisionState:
    return registry.resolve_revision("acme", f"bot@{revision}").state


def test_deprecating_a_canary_candidate_is_refused_naming_the_release(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    store, controller = _to_canary(registry, env, clock)
    release = store.latest_release("acme", "bot")
    assert _served(registry) == {"v1", "v2"}
    audited = len(registry.audit_log())
    with pytest.raises(RegistryError, match=release.release_id) as refused:
        registry.set_release("acme/bot@v2", "ops", RevisionState.DEPRECATED)
    assert "canary" in str(refused.value) and "acme/bot@v2" in str(refused.value)
    # the baseline too: deprecated, it left every caller outside the canary a 404 (181 of 200)
    with pytest.raises(RegistryError, match=release.release_id):
        registry.set_release("acme/bot@v1", "ops", RevisionState.DEPRECATED)
    # nothing changed: the candidate keeps its state and its callers, the release its state
    assert _state(registry, "v2") is not RevisionState.DEPRECATED
    assert _served(registry) == {"v1", "v2"}
    controller.tick()
    assert store.latest_release("acme", "bot").state is S.CANARY
    assert len(registry.audit_log()) == audited
    # its warm policy, and every other revision, may still change
    warmed = registry.set_release("acme/bot@v2", "ops", warm_policy=WarmPolicy.CPU)
    assert warmed.warm_policy is WarmPolicy.CPU and warmed.state is not RevisionState.DEPRECATED
    registry.set_release("acme/bot@v3", "ops", RevisionState.DEPRECATED)
    assert _state(registry, "v3") is RevisionState.DEPRECATED


def test_a_candidate_before_its_canary_is_held_too(registry: Registry) -> None:
    """A staged release would otherwise start a canary no caller is ever drawn into."""
    store = ReleaseStore(registry)
    staged = store.start_release("acme", "bot", "v2", PLAN, actor="ops")
    assert staged.state is S.STAGED
    with pytest.raises(RegistryError, match=staged.release_id):
        registry.set_release("acme/bot@v2", "ops", RevisionState.DEPRECATED)


def test_once_the_release_is_over_the_candidate_may_be_deprecated(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    store, _ = _to_canary(registry, env, clock)
    assert store.rollback("acme", "bot", actor="ops").state is S.ROLLED_BACK
    registry.set_release("acme/bot@v2", "ops", RevisionState.DEPRECATED)
    assert _state(registry, "v2") is RevisionState.DEPRECATED
    assert _served(registry) == {"v1"}


def test_the_baseline_is_the_heaviest_target_callers_are_sent_to(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    """An alias may keep a deprecated target beside a servable one; resolution skips it. The
    baseline was the heaviest target whatever its state: with v1 (weight 9, deprecated) beside v3
    (weight 1), a release of v2 took v1, no caller outside the canary was sent to it (all went to
    v3), and every step compared the candidate with an empty window (the latency guards need
    samples on both sides, so they never ran) while v1 was pinned resident for nothing. Now
    the baseline is the heaviest target resolution serves."""
    targets = (AliasTarget("v1", 9), AliasTarget("v3", 1))
    registry.set_alias("acme", "bot", targets, "ops")
    registry.set_release("acme/bot@v1", "ops", RevisionState.DEPRECATED)
    assert _served(registry) == {"v3"}
    store, _ = _to_canary(registry, env, clock)
    release = store.latest_release("acme", "bot")
    assert release.baseline == "v3"
    assert _served(registry) == {"v2", "v3"}
    assert env.pinned == {"v2", "v3"}  # the revision the other callers get stays resident


def test_a_release_of_an_alias_that_serves_nothing_is_refused(registry: Registry) -> None:
    """Every target deprecated: no baseline to compare with (before, the deprecated one)."""
    registry.set_release("acme/bot@v1", "ops", RevisionState.DEPRECATED)
    store = ReleaseStore(registry)
    with pytest.raises(ReleaseStartError, match="serves no revision"):
        store.start_release("acme", "bot", "v2", PLAN, actor="ops")
    assert store.list_releases(include_terminal=True, tenant="acme") == []


def test_after_promotion_the_baseline_may_be_deprecated_and_a_rollback_is_then_refused(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    """Deprecating the old baseline once the release is promoted is the operator retiring it
    (correct, not a defect): no caller is sent to it, the callers the canary had on the candidate
    included, and a rollback to it is refused (release and alias alike) naming the deprecation,
    changing nothing; made stable again, it is the rollback target it was."""
    store, controller = _to_canary(registry, env, clock)
    sticky = [f"user-{i}" for i in range(200)]
    on_candidate = [
        user
        for user in sticky
        if registry.resolve_revision("acme", "bot", sticky_key=user).revision == "v2"
    ]
    assert on_candidate  # the canary had callers on the candidate
    store.promote("acme", "bot", actor="ops")
    controller.tick()
    registry.set_release("acme/bot@v1", "ops", RevisionState.DEPRECATED)
    assert _served(registry) == {"v2"}
    alias = registry.get_alias("acme", "bot")
    assert alias is not None and alias.rollback_targets == (AliasTarget("v1", 1),)
    audited = len(registry.audit_log())
    with pytest.raises(RegistryError, match="v1 are all deprecated"):
        store.rollback("acme", "bot", actor="ops")
    with pytest.raises(RegistryError, match="v1 are all deprecated"):
        registry.rollback_alias("acme", "bot", "ops")
    assert store.latest_release("acme", "bot").state is S.PROMOTED
    assert registry.get_alias("acme", "bot") == alias
    assert len(registry.audit_log()) == audited
    controller.tick()
    assert _served(registry) == {"v2"}
    registry.set_release("acme/bot@v1", "ops", RevisionState.STABLE)
    assert store.rollback("acme", "bot", actor="ops").state is S.ROLLED_BACK
    assert _served(registry) == {"v1"}
