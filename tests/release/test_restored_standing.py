"""``fleet.standing_restore.read_restored``: the pins a restarted fleet ingress takes as standing
from the registry's releases are the ones the release controller holds at that point of a
release (in flight, promoted within its hold window, after it), and the registry's tenant
settings and warm policies come with them."""

from __future__ import annotations

from conftest import FakeEnv
from test_controller import PLAN, _to_canary

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.clock import ManualClock
from loraplex.fleet.standing_restore import Restored, read_restored
from loraplex.registry import Registry
from loraplex.residency.ledger import Tier


def _revisions(restored: Restored) -> set[str]:
    assert {tier for _, tier in restored.release_pins} <= {Tier.L1}  # the plan has no gpu
    return {key.revision for key, _ in restored.release_pins}


def test_the_restored_release_pins_are_the_controllers_through_a_release(
    registry: Registry, env: FakeEnv, clock: ManualClock, base: BaseModelSpec
) -> None:
    assert read_restored(registry, base.digest, clock.now()).release_pins == frozenset()
    store, controller = _to_canary(registry, env, clock, PLAN)
    restored = read_restored(registry, base.digest, clock.now())
    assert _revisions(restored) == env.pinned == {"v1", "v2"}
    assert {key.revision for key in restored.release_keys} == {"v1", "v2"}

    hold_until = store.promote("acme", "bot", actor="ops").hold_until
    assert hold_until is not None
    clock.advance(1.0)
    controller.tick()
    restored = read_restored(registry, base.digest, clock.now())
    assert _revisions(restored) == env.pinned == {"v1"}  # the baseline's hold
    assert {key.revision for key in restored.release_keys} == {"v1", "v2"}

    clock.advance(hold_until - clock.now() + 1.0)  # the window is over, not yet ticked
    assert read_restored(registry, base.digest, clock.now()).release_pins == frozenset()
    controller.tick()
    assert env.pinned == set()
    assert read_restored(registry, base.digest, clock.now()).release_keys == frozenset()


def test_the_registrys_tenants_and_warm_policies_are_restored(
    registry: Registry, clock: ManualClock, base: BaseModelSpec
) -> None:
    registry.set_release("acme/bot@v3", "ops", None, WarmPolicy.CPU)
    restored = read_restored(registry, base.digest, clock.now())
    assert {key.revision: warm for key, warm in restored.warm.items()} == {"v3": WarmPolicy.CPU}
    assert restored.tenants is not None and set(restored.tenants) == {"acme"}
    other_base = read_restored(registry, "0" * 64, clock.now())
    assert other_base.warm == {}  # a revision of another base model is not this fleet's


def test_the_registrys_operator_pins_are_restored_and_a_stale_one_dropped(
    registry: Registry, clock: ManualClock, base: BaseModelSpec
) -> None:
    registry.record_operator_pin("acme/bot@v3", "L0", "ops")
    registry.set_release("acme/bot@v2", "ops", None, WarmPolicy.ON_DEMAND)  # automatic: off
    with registry.db.transaction() as tx:  # a pin whose revision is gone
        tx.execute(
            "INSERT INTO operator_pins VALUES ('acme', 'bot', 'v9', 'L1', ?, 1.0, 'ops')",
            ("d" * 64,),
        )
    restored = read_restored(registry, base.digest, clock.now())
    assert {(key.revision, tier) for key, tier in restored.operator_pins} == {("v3", Tier.L0)}
    assert {key.revision: warm for key, warm in restored.warm.items()} == {
        "v2": WarmPolicy.ON_DEMAND
    }
    assert [p.revision.ref for p in registry.operator_pins(base.digest)] == ["acme/bot@v3"]
