"""Versioned schema migrations, applied in order, each exactly once, in one transaction.

``schema_migrations`` records every applied version. ``migrate`` is idempotent and safe to run
from several processes at once (it runs inside a serialised write transaction), and refuses a
database whose schema is newer than this code knows. Migrations are append-only: a released
migration is never edited; a change is a new version.

Types are chosen to mean the same in both engines (TEXT, BIGINT, DOUBLE PRECISION); where the
engines differ (identity columns, triggers) a migration carries per-dialect statements.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from loraplex.errors import RegistryError
from loraplex.registry.sql.db import Database, Tx

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Migration:
    """One schema version."""

    version: int  # strictly increasing, starting at 1
    name: str  # what it does, recorded in schema_migrations
    statements: tuple[str, ...]  # portable DDL, run first
    dialect_statements: dict[str, tuple[str, ...]] = field(default_factory=dict)  # then these

    def __post_init__(self) -> None:
        if self.version < 1:
            raise ValueError(f"version {self.version} is invalid; expected an int >= 1")

    def for_dialect(self, dialect: str) -> tuple[str, ...]:
        return self.statements + self.dialect_statements.get(dialect, ())


_TABLES = (
    """CREATE TABLE tenants (
        name TEXT PRIMARY KEY,
        priority TEXT NOT NULL,
        max_gpu_bytes BIGINT,
        max_cpu_bytes BIGINT,
        max_disk_bytes BIGINT,
        max_cold_loads BIGINT,
        max_requests_per_s DOUBLE PRECISION,
        created_at DOUBLE PRECISION NOT NULL)""",
    """CREATE TABLE api_keys (
        key_id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL REFERENCES tenants (name),
        token_sha256 TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        revoked_at DOUBLE PRECISION)""",
    "CREATE INDEX api_keys_by_tenant ON api_keys (tenant)",
    """CREATE TABLE adapters (
        tenant TEXT NOT NULL REFERENCES tenants (name),
        name TEXT NOT NULL,
        visibility TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (tenant, name))""",
    """CREATE TABLE revisions (
        tenant TEXT NOT NULL,
        name TEXT NOT NULL,
        revision TEXT NOT NULL,
        adapter_digest TEXT NOT NULL,
        config_digest TEXT NOT NULL,
        base_digest TEXT NOT NULL,
        compat_version BIGINT NOT NULL,
        max_rank BIGINT NOT NULL,
        lora_alpha DOUBLE PRECISION NOT NULL,
        use_rslora BIGINT NOT NULL,
        target_modules TEXT NOT NULL,
        dtype TEXT NOT NULL,
        tensor_bytes BIGINT NOT NULL,
        estimated_bytes BIGINT NOT NULL,
        store_url TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        state TEXT NOT NULL,
        warm_policy TEXT NOT NULL,
        probe_prompt TEXT,
        expected_continuation TEXT,
        PRIMARY KEY (tenant, name, revision),
        FOREIGN KEY (tenant, name) REFERENCES adapters (tenant, name))""",
    """CREATE TABLE aliases (
        tenant TEXT NOT NULL,
        name TEXT NOT NULL,
        targets TEXT NOT NULL,
        rollback_targets TEXT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (tenant, name),
        FOREIGN KEY (tenant, name) REFERENCES adapters (tenant, name))""",
)

# Columns fixed at registration; the triggers below refuse any change to them.
IMMUTABLE_REVISION_COLUMNS = (
    "adapter_digest",
    "config_digest",
    "base_digest",
    "compat_version",
    "max_rank",
    "lora_alpha",
    "use_rslora",
    "target_modules",
    "dtype",
    "tensor_bytes",
    "estimated_bytes",
    "store_url",
    "created_at",
    "probe_prompt",
    "expected_continuation",
)

_SQLITE_GUARDS = (
    """CREATE TABLE audit_log (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        at DOUBLE PRECISION NOT NULL,
        actor TEXT NOT NULL,
        action TEXT NOT NULL,
        subject TEXT NOT NULL,
        details TEXT NOT NULL)""",
    """CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
        BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END""",
    """CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
        BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END""",
    f"""CREATE TRIGGER revisions_immutable
        BEFORE UPDATE OF {", ".join(IMMUTABLE_REVISION_COLUMNS)} ON revisions
        BEGIN SELECT RAISE(ABORT, 'revision content is immutable'); END""",
    """CREATE TRIGGER revisions_no_delete BEFORE DELETE ON revisions
        BEGIN SELECT RAISE(ABORT, 'revisions are never deleted; deprecate instead'); END""",
)

_POSTGRES_GUARDS = (
    """CREATE TABLE audit_log (
        seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at DOUBLE PRECISION NOT NULL,
        actor TEXT NOT NULL,
        action TEXT NOT NULL,
        subject TEXT NOT NULL,
        details TEXT NOT NULL)""",
    """CREATE FUNCTION loraplex_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $body$
        BEGIN RAISE EXCEPTION '% on % is not allowed', TG_OP, TG_TABLE_NAME; END $body$""",
    """CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
        FOR EACH ROW EXECUTE FUNCTION loraplex_refuse_change()""",
    f"""CREATE TRIGGER revisions_immutable
        BEFORE UPDATE OF {", ".join(IMMUTABLE_REVISION_COLUMNS)} ON revisions
        FOR EACH ROW
        WHEN (({", ".join(f"OLD.{c}" for c in IMMUTABLE_REVISION_COLUMNS)})
              IS DISTINCT FROM ({", ".join(f"NEW.{c}" for c in IMMUTABLE_REVISION_COLUMNS)}))
        EXECUTE FUNCTION loraplex_refuse_change()""",
    """CREATE TRIGGER revisions_no_delete BEFORE DELETE ON revisions
        FOR EACH ROW EXECUTE FUNCTION loraplex_refuse_change()""",
)

# Version 2: controlled releases (loraplex/release) and the alias history. ``active`` is 1 while
# a release is not terminal and NULL after: the partial unique index allows one active release
# per alias, and the per-request canary lookup (``sql/releases.py``) reads through it.
_RELEASES = (
    """CREATE TABLE releases (
        release_id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        name TEXT NOT NULL,
        candidate TEXT NOT NULL,
        baseline TEXT NOT NULL,
        state TEXT NOT NULL,
        active BIGINT,
        step BIGINT NOT NULL,
        canary_share DOUBLE PRECISION,
        plan TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        step_started_at DOUBLE PRECISION,
        reason TEXT,
        actor TEXT NOT NULL,
        hold_until DOUBLE PRECISION,
        version BIGINT NOT NULL,
        comparison TEXT,
        FOREIGN KEY (tenant, name) REFERENCES adapters (tenant, name))""",
    "CREATE UNIQUE INDEX releases_one_active ON releases (tenant, name) WHERE active = 1",
    "CREATE INDEX releases_by_alias ON releases (tenant, name, created_at)",
    "CREATE INDEX releases_held ON releases (hold_until) WHERE hold_until IS NOT NULL",
    """CREATE TABLE alias_history (
        tenant TEXT NOT NULL,
        name TEXT NOT NULL,
        seq BIGINT NOT NULL,
        targets TEXT NOT NULL,
        pushed_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (tenant, name, seq),
        FOREIGN KEY (tenant, name) REFERENCES adapters (tenant, name))""",
    # The one-level rollback target of version 1 becomes the first history entry.
    """INSERT INTO alias_history (tenant, name, seq, targets, pushed_at)
        SELECT tenant, name, 1, rollback_targets, updated_at FROM aliases
        WHERE rollback_targets <> '[]'""",
)

# Version 3: per-tenant engine seats (loraplex/engine/sched/seats.py). NULL: no cap; a tenant
# created before gets no reservation.
_TENANT_SEATS = (
    "ALTER TABLE tenants ADD COLUMN max_running_seqs BIGINT",
    "ALTER TABLE tenants ADD COLUMN reserved_running_seqs BIGINT NOT NULL DEFAULT 0",
    "ALTER TABLE tenants ADD COLUMN max_kv_blocks BIGINT",
)

# Version 4: signed adapters (issue 32). A revision's provenance (bundle object, signer, trust
# anchor, signed manifest digest, verification time) is fixed at registration like its content;
# a tenant's trust policy and anchors (public keys, certificate roots) are its own tables.
_PROVENANCE_COLUMNS = (
    "signature_digest",
    "signer",
    "trust_anchor",
    "signed_manifest_digest",
    "verified_at",
)
_SIGNING = (
    "ALTER TABLE revisions ADD COLUMN signature_digest TEXT",
    "ALTER TABLE revisions ADD COLUMN signer TEXT",
    "ALTER TABLE revisions ADD COLUMN trust_anchor TEXT",
    "ALTER TABLE revisions ADD COLUMN signed_manifest_digest TEXT",
    "ALTER TABLE revisions ADD COLUMN verified_at DOUBLE PRECISION",
    """CREATE TABLE trust_policies (
        tenant TEXT PRIMARY KEY REFERENCES tenants (name),
        policy TEXT NOT NULL,
        identities TEXT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL)""",
    """CREATE TABLE trust_anchors (
        tenant TEXT NOT NULL REFERENCES tenants (name),
        name TEXT NOT NULL,
        kind TEXT NOT NULL,
        pem TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        added_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (tenant, name))""",
)
_SIGNING_GUARDS: dict[str, tuple[str, ...]] = {
    "sqlite": (
        f"""CREATE TRIGGER revisions_provenance_immutable
        BEFORE UPDATE OF {", ".join(_PROVENANCE_COLUMNS)} ON revisions
        BEGIN SELECT RAISE(ABORT, 'revision provenance is immutable'); END""",
    ),
    "postgres": (
        f"""CREATE TRIGGER revisions_provenance_immutable
        BEFORE UPDATE OF {", ".join(_PROVENANCE_COLUMNS)} ON revisions
        FOR EACH ROW
        WHEN (({", ".join(f"OLD.{c}" for c in _PROVENANCE_COLUMNS)})
              IS DISTINCT FROM ({", ".join(f"NEW.{c}" for c in _PROVENANCE_COLUMNS)}))
        EXECUTE FUNCTION loraplex_refuse_change()""",
    ),
}

# Version 5: the admin listings read one page at a time in their order (``sql/paging.py``); without
# these a page sorted every release (or key) to find its first rows.
_LISTING_ORDER = (
    "CREATE INDEX releases_by_created ON releases (created_at, release_id)",
    "CREATE INDEX api_keys_in_order ON api_keys (tenant, created_at, key_id)",
)

# Version 6: the revisions of one adapter in the order their paged listing reads them
# (``GET /admin/adapters/{tenant}/{name}``); without it a page sorted all of the adapter's
# revisions (never deleted: one per registered checkpoint) to find its first rows.
_REVISION_ORDER = (
    "CREATE INDEX revisions_in_order ON revisions (tenant, name, created_at, revision)",
)

# Version 7: a trust anchor's key id (a key's model-signing hint, a certificate root's subject),
# so a registration reads the anchors its bundle names rather than every anchor of the tenant.
# Rows added before it get theirs when the registry opens (``trust.fill_key_ids``).
_ANCHOR_KEY_IDS = (
    "ALTER TABLE trust_anchors ADD COLUMN key_id TEXT",
    "CREATE INDEX trust_anchors_by_key_id ON trust_anchors (tenant, key_id)",
)

# Version 8: operator residency settings that outlive a server restart. ``operator_pins`` holds
# each ``/admin/residency/pin`` of a revision in a tier until its unpin (a release's holds are
# not here: releases persist their own state). No foreign key to ``revisions``: the restore
# at start is the one place that finds a pin whose revision (or content) is gone, drops it and
# says so. ``warm_by_operator`` tells an operator's ``on_demand`` (automatic promotion off for
# the revision) from the default one (automatic); revisions made before read as the default.
_OPERATOR_RESIDENCY = (
    """CREATE TABLE operator_pins (
        tenant TEXT NOT NULL,
        name TEXT NOT NULL,
        revision TEXT NOT NULL,
        tier TEXT NOT NULL,
        adapter_digest TEXT NOT NULL,
        pinned_at DOUBLE PRECISION NOT NULL,
        actor TEXT NOT NULL,
        PRIMARY KEY (tenant, name, revision, tier))""",
    "ALTER TABLE revisions ADD COLUMN warm_by_operator BIGINT NOT NULL DEFAULT 0",
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        version=1,
        name="tenants, keys, adapters, revisions, aliases, audit log",
        statements=_TABLES,
        dialect_statements={"sqlite": _SQLITE_GUARDS, "postgres": _POSTGRES_GUARDS},
    ),
    Migration(version=2, name="releases, alias history", statements=_RELEASES),
    Migration(version=3, name="tenant seats", statements=_TENANT_SEATS),
    Migration(
        version=4,
        name="signed adapters: provenance, trust policies and anchors",
        statements=_SIGNING,
        dialect_statements=_SIGNING_GUARDS,
    ),
    Migration(version=5, name="admin listing order indexes", statements=_LISTING_ORDER),
    Migration(version=6, name="revision listing order index", statements=_REVISION_ORDER),
    Migration(version=7, name="trust anchor key ids", statements=_ANCHOR_KEY_IDS),
    Migration(
        version=8, name="operator pins, operator warm policies", statements=_OPERATOR_RESIDENCY
    ),
)

_CREATE_VERSIONS = """CREATE TABLE IF NOT EXISTS schema_migrations (
    version BIGINT PRIMARY KEY,
    name TEXT NOT NULL,
    applied_at DOUBLE PRECISION NOT NULL)"""


def migrate(db: Database, now: float, migrations: tuple[Migration, ...] = MIGRATIONS) -> int:
    """Bring the schema to the newest version; returns it. Safe to call on every start."""
    _check_order(migrations)
    with db.transaction() as tx:
        tx.execute(_CREATE_VERSIONS)
        applied = applied_versions(tx)
        newest = migrations[-1].version if migrations else 0
        if applied and max(applied) > newest:
            raise RegistryError(
                f"database {db.url} has schema version {max(applied)}; this loraplex knows "
                f"versions up to {newest} (upgrade loraplex, or restore the backup taken "
                "before the upgrade: docs/operations.md, Upgrades)"
            )
        for migration in migrations:
            if migration.version in applied:
                continue
            for statement in migration.for_dialect(db.dialect):
                tx.execute(statement)
            tx.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                (migration.version, migration.name, now),
            )
    if applied and max(applied) < newest:
        # NOTE: an upgrade is one-way (an older loraplex refuses this database from now on), so
        # it is said, not done in silence; a new database (nothing applied) is not an upgrade.
        _log.warning(
            "registry %s: schema upgraded from version %d to %d; older loraplex versions refuse "
            "it from now on",
            db.url,
            max(applied),
            newest,
        )
    return newest


def applied_versions(tx: Tx) -> set[int]:
    return {int(row[0]) for row in tx.query("SELECT version FROM schema_migrations")}


def _check_order(migrations: tuple[Migration, ...]) -> None:
    versions = [migration.version for migration in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise ValueError(f"migration versions {versions} are invalid; expected 1, 2, 3, ...")
