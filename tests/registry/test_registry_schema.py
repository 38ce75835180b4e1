"""Schema migrations and database-enforced invariants, on both databases."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from registry_kit import AdapterFactory

from loraplex.errors import RegistryError
from loraplex.registry import RegistrationRequest, Registry
from loraplex.registry.sql.connect import open_database
from loraplex.registry.sql.db import Database
from loraplex.registry.sql.migrations import MIGRATIONS, Migration, applied_versions, migrate


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = open_database(database_url)
    yield database
    database.close()


def _versions(db: Database) -> set[int]:
    with db.transaction(write=False) as tx:
        return applied_versions(tx)


def test_migrate_is_versioned_and_idempotent(db: Database) -> None:
    newest = MIGRATIONS[-1].version
    assert migrate(db, now=1.0) == newest
    assert migrate(db, now=2.0) == newest
    assert _versions(db) == set(range(1, newest + 1))
    with db.transaction(write=False) as tx:
        applied_at = tx.query("SELECT applied_at FROM schema_migrations ORDER BY version")
    assert applied_at == [(1.0,)] * newest


def test_only_new_migrations_run(db: Database) -> None:
    migrate(db, now=1.0)
    extra = Migration(
        version=len(MIGRATIONS) + 1,
        name="test column",
        statements=("ALTER TABLE tenants ADD COLUMN note TEXT",),
    )
    migrate(db, now=2.0, migrations=(*MIGRATIONS, extra))
    migrate(db, now=3.0, migrations=(*MIGRATIONS, extra))
    assert extra.version in _versions(db)
    with db.transaction(write=False) as tx:
        assert tx.query("SELECT note FROM tenants") == []


def test_an_upgrade_is_said_and_a_new_or_current_database_is_not(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    newest = MIGRATIONS[-1].version
    with caplog.at_level(logging.WARNING, logger="loraplex.registry.sql.migrations"):
        migrate(db, now=1.0, migrations=MIGRATIONS[:1])  # a database an older loraplex made
        assert caplog.messages == []
        migrate(db, now=2.0)
        migrate(db, now=3.0)
    assert caplog.messages == [
        f"registry {db.url}: schema upgraded from version 1 to {newest}; older loraplex "
        "versions refuse it from now on"
    ]


def test_a_newer_schema_is_refused(db: Database) -> None:
    future = Migration(version=len(MIGRATIONS) + 1, name="future", statements=())
    migrate(db, now=1.0, migrations=(*MIGRATIONS, future))
    with pytest.raises(RegistryError, match="upgrade loraplex, or restore the backup"):
        migrate(db, now=2.0)


def test_migration_order_is_checked(db: Database) -> None:
    gap = Migration(version=3, name="gap", statements=())
    with pytest.raises(ValueError, match="migration versions"):
        migrate(db, now=1.0, migrations=(*MIGRATIONS[:1], gap))


def test_failed_migration_rolls_back_completely(db: Database) -> None:
    broken = Migration(
        version=len(MIGRATIONS) + 1,
        name="broken",
        statements=("CREATE TABLE half_done (x TEXT)", "THIS IS NOT SQL"),
    )
    migrate(db, now=1.0)
    with pytest.raises(Exception, match=r"(?i)syntax"):
        migrate(db, now=2.0, migrations=(*MIGRATIONS, broken))
    assert broken.version not in _versions(db)
    with pytest.raises(Exception, match=r"(?i)half_done"), db.transaction() as tx:
        tx.query("SELECT x FROM half_done")


def test_audit_log_is_append_only(registry: Registry) -> None:
    registry.create_tenant("acme", "ops")
    for statement in ("UPDATE audit_log SET actor = 'mallory'", "DELETE FROM audit_log"):
        with pytest.raises(Exception, match="audit_log"), registry.db.transaction() as tx:
            tx.execute(statement)
    assert [e.actor for e in registry.audit_log()] == ["ops"]


def test_revision_content_is_immutable_in_the_database(
    registry: Registry, make_adapter: AdapterFactory
) -> None:
    registry.create_tenant("acme", "ops")
    rev = registry.register(RegistrationRequest(make_adapter("a"), "acme", "b", "v1"), "x")
    for statement in (
        "UPDATE revisions SET adapter_digest = 'x'",
        "UPDATE revisions SET max_rank = 64",
        "DELETE FROM revisions",
    ):
        with pytest.raises(Exception, match=r"(?i)revision"), registry.db.transaction() as tx:
            tx.execute(statement)
    assert registry.get_revision("acme/b@v1") == rev.revision
    with registry.db.transaction() as tx:
        tx.execute("UPDATE revisions SET state = 'deprecated'")
    assert registry.get_revision("acme/b@v1").state.value == "deprecated"
