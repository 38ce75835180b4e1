"""Operator pins and operator warm policies in the registry (schema 8), on both databases: what a
server restart reads back, what it drops, and the migration from schema 7."""

from __future__ import annotations

from pathlib import Path

import pytest
from registry_kit import AdapterFactory

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.store import LocalArtifactStore
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.errors import AdapterNotFoundError
from loraplex.registry import RegistrationRequest, Registry
from loraplex.registry.operator_pins import PIN_TIERS
from loraplex.registry.sql.connect import open_database
from loraplex.registry.sql.migrations import MIGRATIONS, migrate
from loraplex.residency.ledger import Tier

REF = "acme/bot@v1"


@pytest.fixture
def acme(registry: Registry, make_adapter: AdapterFactory) -> Registry:
    registry.create_tenant("acme", "ops")
    for revision in ("v1", "v2"):
        request = RegistrationRequest(make_adapter(revision), "acme", "bot", revision)
        registry.register(request, "ops")
    return registry


def _pins(registry: Registry) -> list[tuple[str, str]]:
    assert registry.base_digest is not None
    return [(p.revision.ref, p.tier) for p in registry.operator_pins(registry.base_digest)]


def _actions(registry: Registry) -> list[tuple[str, str, dict[str, object]]]:
    return [(e.action, e.subject, e.details) for e in registry.audit_log() if "pin" in e.action]


def test_pins_are_recorded_once_and_removed_with_audit_rows(acme: Registry) -> None:
    assert acme.record_operator_pin(REF, "L1", "ops") is True
    assert acme.record_operator_pin(REF, "L1", "ops") is False  # again: nothing written
    assert acme.record_operator_pin(REF, "L0", "ops") is True
    assert _pins(acme) == [(REF, "L0"), (REF, "L1")]
    assert acme.remove_operator_pin(REF, "L1", "ops") is True
    assert acme.remove_operator_pin(REF, "L1", "ops") is False
    assert _pins(acme) == [(REF, "L0")]
    assert _actions(acme) == [
        ("residency.pin", REF, {"tier": "L1"}),
        ("residency.pin", REF, {"tier": "L0"}),
        ("residency.unpin", REF, {"tier": "L1"}),
    ]


def test_a_pin_of_an_unknown_revision_or_tier_is_refused_and_writes_nothing(
    acme: Registry,
) -> None:
    with pytest.raises(AdapterNotFoundError, match="acme/bot@v9 does not exist"):
        acme.record_operator_pin("acme/bot@v9", "L1", "ops")
    with pytest.raises(ValueError, match="tier 'L3' is invalid; expected one of L0, L1, L2"):
        acme.record_operator_pin(REF, "L3", "ops")
    with pytest.raises(ValueError, match="tenant/name@revision"):
        acme.record_operator_pin("acme/bot", "L1", "ops")
    assert _pins(acme) == [] and _actions(acme) == []


def test_pin_tiers_are_the_cache_tiers_a_pin_may_hold() -> None:
    assert tuple(t.name for t in Tier if t is not Tier.L3) == PIN_TIERS


def test_a_restore_drops_pins_whose_revision_tenant_or_content_is_gone(acme: Registry) -> None:
    acme.record_operator_pin(REF, "L1", "ops")
    acme.record_operator_pin("acme/bot@v2", "L2", "ops")
    stale = [
        ("acme", "bot", "gone", "d" * 64),  # its revision no longer exists
        ("ghost", "bot", "v1", "d" * 64),  # its tenant neither
    ]
    with acme.db.transaction() as tx:
        for tenant, name, revision, digest in stale:
            tx.execute(
                "INSERT INTO operator_pins VALUES (?, ?, ?, 'L1', ?, 1.0, 'ops')",
                (tenant, name, revision, digest),
            )
        # v2's row as a registry restored from elsewhere could hold it: other bytes
        tx.execute("UPDATE operator_pins SET adapter_digest = ? WHERE revision = 'v2'", ("e" * 64,))
    assert acme.base_digest is not None
    restored = acme.restore_operator_pins(acme.base_digest, "server:restore")
    assert [(p.revision.ref, p.tier) for p in restored.served] == [(REF, "L1")]
    assert [(pin.ref, why) for pin, why in restored.dropped] == [
        ("acme/bot@gone", "revision acme/bot@gone no longer exists"),
        ("acme/bot@v2", "revision acme/bot@v2 now holds other bytes than those pinned"),
        ("ghost/bot@v1", "tenant 'ghost' no longer exists"),
    ]
    assert _pins(acme) == [(REF, "L1")]  # dropped from the registry, the sound one kept
    dropped = [a for a in _actions(acme) if a[0] == "residency.pin_dropped"]
    subjects = [subject for _, subject, _ in dropped]
    assert subjects == ["acme/bot@gone", "acme/bot@v2", "ghost/bot@v1"]
    again = acme.restore_operator_pins(acme.base_digest, "server:restore")
    assert again.dropped == () and len(again.served) == 1


def test_a_pin_of_another_base_models_revision_is_kept_not_served(acme: Registry) -> None:
    acme.record_operator_pin(REF, "L1", "ops")
    restored = acme.restore_operator_pins("f" * 64, "server:restore")
    assert restored.served == () and restored.dropped == ()
    assert [pin.ref for pin in restored.other_base] == [REF]
    assert acme.operator_pins("f" * 64) == [] and _pins(acme) == [(REF, "L1")]


def test_an_operators_on_demand_is_read_back_and_the_default_is_not(acme: Registry) -> None:
    assert acme.base_digest is not None
    assert acme.warm_policies(acme.base_digest) == {}  # registered on_demand: automatic
    acme.set_release("acme/bot@v2", "ops", warm_policy=WarmPolicy.CPU)
    acme.set_release(REF, "ops", warm_policy=WarmPolicy.ON_DEMAND)  # automatic promotion off
    policies = {key.ref: warm for key, warm in acme.warm_policies(acme.base_digest).items()}
    assert policies == {REF: WarmPolicy.ON_DEMAND, "acme/bot@v2": WarmPolicy.CPU}
    acme.set_release(REF, "ops", state=None)  # a state-only change keeps the operator's mark
    assert REF in {key.ref for key in acme.warm_policies(acme.base_digest)}
    assert acme.warm_policies("f" * 64) == {}


def test_migration_8_starts_with_no_pins_and_revisions_read_as_automatic(
    database_url: str, tmp_path: Path, base: BaseModelSpec, make_adapter: AdapterFactory
) -> None:
    db = open_database(database_url)
    try:
        migrate(db, now=1.0, migrations=MIGRATIONS[:7])
        old = Registry(db, LocalArtifactStore(tmp_path / "store"), base)  # a schema-7 registry
        old.create_tenant("acme", "ops")
        old.register(RegistrationRequest(make_adapter("v1"), "acme", "bot", "v1"), "ops")
        with db.transaction() as tx:  # as schema 7 wrote an operator's on_demand: unmarked
            tx.execute("UPDATE revisions SET warm_policy = 'on_demand'")
        assert migrate(db, now=2.0) == 8
        assert old.warm_policies(base.digest) == {}
        assert old.operator_pins(base.digest) == []
        assert old.record_operator_pin(REF, "L0", "ops")
        old.set_release(REF, "ops", warm_policy=WarmPolicy.ON_DEMAND)
        assert [(p.revision.ref, p.tier) for p in old.operator_pins(base.digest)] == [(REF, "L0")]
        assert list(old.warm_policies(base.digest).values()) == [WarmPolicy.ON_DEMAND]
    finally:
        db.close()
