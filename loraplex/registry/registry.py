"""The ``Registry`` service: the control plane's single entry point (one class in three layers:
this file over ``trust_admin.py`` over ``service_base.py``).

Tenants, API keys, adapters, revisions, aliases, resolution and the audit log, over one database
(SQLite or PostgreSQL) and one artifact store. Torch-free. Administrative methods take an
``actor`` (who is acting), recorded in the audit row written in the same transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.manifest import CONFIG_FILE
from loraplex.artifacts.store import fetch_to_file
from loraplex.artifacts.validate import WEIGHTS_FILE
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.registry import (
    operator_pins,
    registration,
    releases,
    resolution,
    stored_signature,
    tenancy,
)
from loraplex.registry.models import (
    Adapter,
    Alias,
    AliasTarget,
    ApiKeyInfo,
    AuditEntry,
    IssuedKey,
    PriorityClass,
    RegistrationRequest,
    RegistrationResult,
    Revision,
    RevisionState,
    Tenant,
    TenantQuotas,
    Visibility,
)
from loraplex.registry.operator_pins import RestoredPins, ServedPin
from loraplex.registry.service_base import split_ref
from loraplex.registry.sql import adapters as adapter_rows
from loraplex.registry.sql import audit
from loraplex.registry.sql import operator_pins as pin_rows
from loraplex.registry.sql import tenants as tenant_rows
from loraplex.registry.sql.paging import Page
from loraplex.registry.trust_admin import TrustAdmin

_log = logging.getLogger(__name__)


class Registry(TrustAdmin):
    """Tenants, keys, adapters and releases; ``resolve`` is where tenant access is decided.
    Signing is ``TrustAdmin``'s; state and lifecycle are ``RegistryBase``'s."""

    # --- tenants and keys ---------------------------------------------------------------------

    def create_tenant(
        self,
        name: str,
        actor: str,
        priority: PriorityClass = PriorityClass.NORMAL,
        quotas: TenantQuotas | None = None,
    ) -> Tenant:
        limits = quotas or TenantQuotas()
        now = self._wall_clock()
        return tenancy.create_tenant(self._db, name, priority, limits, actor=actor, now=now)

    def set_tenant_limits(
        self,
        name: str,
        actor: str,
        priority: PriorityClass | None = None,
        quotas: Mapping[str, int | float | None] | None = None,
    ) -> Tenant:
        """Change the priority class (None keeps it) and the quotas named in ``quotas``
        (``TenantQuotas`` field -> new value, None = unlimited); the others keep their values."""
        now = self._wall_clock()
        changes = quotas or {}
        return tenancy.set_limits(self._db, name, priority, changes, actor=actor, now=now)

    def get_tenant(self, name: str) -> Tenant:
        with self._db.transaction(write=False) as tx:
            return tenancy.require_tenant(tx, name)

    def list_tenants(self, page: Page | None = None) -> list[Tenant]:
        """Every tenant by name, or one ``page`` of them."""
        with self._db.transaction(write=False) as tx:
            return tenant_rows.list_tenants(tx, page)

    def create_key(self, tenant: str, actor: str) -> IssuedKey:
        """A new API key for ``tenant``; its token is in the result and nowhere else."""
        return tenancy.create_key(self._db, tenant, actor, self._wall_clock())

    def revoke_key(self, key_id: str, actor: str) -> ApiKeyInfo:
        return tenancy.revoke_key(self._db, key_id, actor, self._wall_clock())

    def revoke_key_once(self, key_id: str, actor: str) -> tuple[ApiKeyInfo, bool]:
        """``revoke_key`` and whether this call revoked it (False: it already was)."""
        return tenancy.revoke_key_once(self._db, key_id, actor, self._wall_clock())

    def list_keys(self, tenant: str | None = None, page: Page | None = None) -> list[ApiKeyInfo]:
        """Every key (or every key of ``tenant``, which must exist: ``RecordNotFoundError``
        naming it, not an empty list), or one ``page`` of them."""
        with self._db.transaction(write=False) as tx:
            if tenant is not None:
                tenancy.require_tenant(tx, tenant)
            return tenant_rows.list_keys(tx, tenant, page)

    def authenticate(self, token: str) -> Tenant:
        """The tenant of a bearer token; ``AuthenticationError`` if unknown or revoked."""
        return tenancy.authenticate(self._db, token)

    # --- adapters and releases ----------------------------------------------------------------

    def register(self, request: RegistrationRequest, actor: str) -> RegistrationResult:
        """Validate against the served base model, store the files, record the revision."""
        if self._base is None:
            raise ValueError("base is None; registering needs the served base model")
        validated = registration.validate_request(
            self._db, self._base, self._max_lora_rank, request
        )
        signed = registration.check_signature(self._db, request)
        result = registration.register_adapter(
            self._db,
            self._store,
            validated,
            request,
            actor=actor,
            now=self._wall_clock(),
            hook=self._stage_hook,
            signed=signed,
        )
        for warning in validated.warnings:  # accepted, but said: logged and answered
            _log.warning("registering %s: %s", result.revision.ref, warning)
        return replace(result, warnings=validated.warnings)

    def set_visibility(self, tenant: str, name: str, visibility: Visibility, actor: str) -> Adapter:
        now = self._wall_clock()
        return releases.set_visibility(self._db, tenant, name, visibility, actor=actor, now=now)

    def set_release(
        self,
        ref: str,
        actor: str,
        state: RevisionState | None = None,
        warm_policy: WarmPolicy | None = None,
    ) -> Revision:
        """Change the state and/or warm policy of ``tenant/name@revision``."""
        tenant, name, revision = split_ref(ref)
        now = self._wall_clock()
        return releases.set_release(
            self._db,
            tenant,
            name,
            revision,
            state=state,
            warm_policy=warm_policy,
            actor=actor,
            now=now,
        )

    def set_alias(
        self, tenant: str, name: str, targets: tuple[AliasTarget, ...], actor: str
    ) -> Alias:
        now = self._wall_clock()
        return releases.set_alias(self._db, tenant, name, targets, actor=actor, now=now)

    def rollback_alias(self, tenant: str, name: str, actor: str) -> Alias:
        now = self._wall_clock()
        return releases.rollback_alias(self._db, tenant, name, actor=actor, now=now)

    def alias_history(self, tenant: str, name: str) -> list[tuple[tuple[AliasTarget, ...], float]]:
        """Earlier targets of the alias, newest first (what successive rollbacks return to),
        each with the time it was replaced."""
        return releases.alias_history(self._db, tenant, name)

    # --- operator residency settings (they outlive a restart: ``operator_pins.py``) ----------

    def record_operator_pin(self, ref: str, tier: str, actor: str) -> bool:
        """Records an operator's pin of ``tenant/name@revision`` in ``tier`` (``L0``-``L2``);
        False when it was recorded already."""
        now = self._wall_clock()
        return operator_pins.record(self._db, split_ref(ref), tier, actor=actor, now=now)

    def remove_operator_pin(self, ref: str, tier: str, actor: str) -> bool:
        """Removes an operator's pin; False when none was recorded."""
        now = self._wall_clock()
        return operator_pins.remove(self._db, split_ref(ref), tier, actor=actor, now=now)

    def operator_pins(self, base_digest: str) -> list[ServedPin]:
        """The recorded operator pins of revisions of the base model ``base_digest``."""
        return operator_pins.served(self._db, base_digest)

    def restore_operator_pins(self, base_digest: str, actor: str) -> RestoredPins:
        """``operator_pins`` at a server's start, dropping (audited) the pins whose revision,
        tenant or content is gone."""
        now = self._wall_clock()
        return operator_pins.restore(self._db, base_digest, actor=actor, now=now)

    def warm_policies(self, base_digest: str) -> dict[AdapterKey, WarmPolicy]:
        """The warm policy the cache must hold for each revision of ``base_digest`` that has
        one: every policy other than ``on_demand``, and an operator's ``on_demand``."""
        with self._db.transaction(write=False) as tx:
            found = pin_rows.operator_warm(tx, base_digest)
        return {revision.key(): revision.warm_policy for revision in found}

    # --- reading (administrators) -------------------------------------------------------------

    def get_adapter(self, tenant: str, name: str) -> Adapter:
        """One adapter's record (a tenant's model card reads it: ``serving``)."""
        with self._db.transaction(write=False, serving=True) as tx:
            return releases.require_adapter(tx, tenant, name)

    def list_adapters(self, owner: str | None = None, page: Page | None = None) -> list[Adapter]:
        """Every adapter (or every adapter of ``owner``, which must exist:
        ``RecordNotFoundError`` naming it, not an empty list), or one ``page`` of them, for
        administrators."""
        with self._db.transaction(write=False) as tx:
            if owner is not None:
                tenancy.require_tenant(tx, owner)
            return adapter_rows.list_adapters(tx, owner, page)

    def list_revisions(self, tenant: str, name: str, page: Page | None = None) -> list[Revision]:
        """The adapter's revisions, oldest first: every one, or one ``page`` of them."""
        with self._db.transaction(write=False) as tx:
            releases.require_adapter(tx, tenant, name)
            return adapter_rows.list_revisions(tx, tenant, name, page)

    def get_alias(self, tenant: str, name: str) -> Alias | None:
        with self._db.transaction(write=False) as tx:
            return adapter_rows.get_alias(tx, tenant, name)

    def audit_log(self, after_seq: int = 0, limit: int = 1000) -> list[AuditEntry]:
        with self._db.transaction(write=False) as tx:
            return audit.entries(tx, after_seq, limit)

    # --- tenants' view ------------------------------------------------------------------------

    def usable_adapters(self, caller: str, page: Page | None = None) -> list[Adapter]:
        """What ``caller`` may use: its own adapters and public ones whose alias serves a
        revision (on the served base model, when this registry knows it), exactly those that
        ``resolve`` answers by name; nothing else (every one, or one ``page`` of them)."""
        dialect, base = self._db.dialect, self.base_digest
        with self._db.transaction(write=False, serving=True) as tx:
            return adapter_rows.list_usable_adapters(
                tx, caller, page, dialect=dialect, base_digest=base
            )

    def resolve(self, caller: str, model_string: str, request_id: str | None = None) -> AdapterKey:
        """``name``, ``tenant/name`` or ``...@revision`` -> the revision that will answer."""
        return self.resolve_revision(caller, model_string, request_id).key()

    def resolve_revision(
        self,
        caller: str,
        model_string: str,
        request_id: str | None = None,
        sticky_key: str | None = None,
    ) -> Revision:
        """Like ``resolve``; the whole revision record (warm policy, probe, sizes).
        ``sticky_key`` (the caller's ``user`` or session id) keeps one caller on one revision,
        for a whole release's canary and through the alias's weights alike; None: the request id
        decides."""
        if request_id is None:
            unit = self._rng.random()
        else:
            unit = resolution.unit_from_request_id(request_id)
        base_digest = None if self._base is None else self._base.digest
        with self._db.transaction(write=False, serving=True) as tx:
            return resolution.resolve_in(
                tx, caller, model_string, base_digest, unit, session_key=sticky_key
            )

    # --- artifacts ----------------------------------------------------------------------------

    def fetch(self, revision: Revision, dest_dir: Path) -> Path:
        """Write the revision's PEFT directory to ``dest_dir`` from the store, verified (a signed
        revision's stored bundle must sign exactly the two digests)."""
        stored_signature.check(self._store, revision)
        fetch_to_file(self._store, revision.config_digest, dest_dir / CONFIG_FILE)
        fetch_to_file(self._store, revision.adapter_digest, dest_dir / WEIGHTS_FILE)
        return dest_dir

    def check_integrity(self) -> list[str]:
        """Problems found: every revision's objects must exist in the store. Empty when sound."""
        with self._db.transaction(write=False) as tx:
            revisions = adapter_rows.all_revisions(tx)
        problems = []
        for rev in revisions:
            for digest in (rev.config_digest, rev.adapter_digest):
                if not self._store.exists(digest):
                    problems.append(f"{rev.ref}: object {digest} missing from {self._store.url}")
        return problems
