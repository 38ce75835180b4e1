"""Tenants and API keys: creation, limits, issuing, revocation and authentication.

Each change runs in one write transaction together with its audit row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, fields
from typing import Any

from loraplex.artifacts.identity import check_name
from loraplex.errors import AuthenticationError, RecordNotFoundError, RegistryError, quoted
from loraplex.registry import keys
from loraplex.registry.models import ApiKeyInfo, IssuedKey, PriorityClass, Tenant, TenantQuotas
from loraplex.registry.sql import audit
from loraplex.registry.sql import tenants as rows
from loraplex.registry.sql.db import Database, Tx

# One message for unknown, malformed and revoked keys: a caller learns nothing by probing.
_BAD_KEY = "invalid API key"
_QUOTA_FIELDS = frozenset(f.name for f in fields(TenantQuotas))


def create_tenant(
    db: Database,
    name: str,
    priority: PriorityClass,
    quotas: TenantQuotas,
    *,
    actor: str,
    now: float,
) -> Tenant:
    tenant = Tenant(
        name=check_name("tenant", name), priority=priority, quotas=quotas, created_at=now
    )
    with db.transaction() as tx:
        if rows.get_tenant(tx, name) is not None:
            raise RegistryError(f"tenant {quoted(name)} already exists")
        rows.insert_tenant(tx, tenant)
        audit.append(tx, "tenant.create", name, _limits(tenant), at=now, actor=actor)
    return tenant


def set_limits(
    db: Database,
    name: str,
    priority: PriorityClass | None,
    quota_changes: Mapping[str, int | float | None],
    *,
    actor: str,
    now: float,
) -> Tenant:
    """Apply the changes to the stored limits in one transaction (None priority: unchanged;
    quotas not named in ``quota_changes``: unchanged), so concurrent changes never lose one."""
    unknown = sorted(set(quota_changes) - _QUOTA_FIELDS)
    if unknown:
        raise ValueError(
            f"quotas {quoted(unknown)} is invalid; expected fields of {sorted(_QUOTA_FIELDS)}"
        )
    with db.transaction() as tx:
        current = require_tenant(tx, name)
        values: dict[str, Any] = {**asdict(current.quotas), **quota_changes}
        quotas = TenantQuotas(**values)  # validates the merged values
        tenant = Tenant(name, priority or current.priority, quotas, current.created_at)
        rows.update_tenant(tx, tenant)
        audit.append(tx, "tenant.set_limits", name, _limits(tenant), at=now, actor=actor)
    return tenant


def require_tenant(tx: Tx, name: str) -> Tenant:
    tenant = rows.get_tenant(tx, name)
    if tenant is None:
        raise RecordNotFoundError(f"tenant {quoted(name)} does not exist")
    return tenant


def create_key(db: Database, tenant: str, actor: str, now: float) -> IssuedKey:
    new = keys.generate_token()
    with db.transaction() as tx:
        require_tenant(tx, tenant)
        rows.insert_key(tx, ApiKeyInfo(new.key_id, tenant, now, None), new.token_sha256)
        audit.append(tx, "key.create", tenant, {"key_id": new.key_id}, at=now, actor=actor)
    return IssuedKey(key_id=new.key_id, tenant=tenant, token=new.token)


def revoke_key(db: Database, key_id: str, actor: str, now: float) -> ApiKeyInfo:
    """Revoke at once: the next ``authenticate`` with this key fails. Idempotent."""
    return revoke_key_once(db, key_id, actor, now)[0]


def revoke_key_once(db: Database, key_id: str, actor: str, now: float) -> tuple[ApiKeyInfo, bool]:
    """``revoke_key``, and whether this call revoked it (False: it already was, nothing was
    written, no audit row)."""
    with db.transaction() as tx:
        stored = rows.get_key(tx, key_id)
        if stored is None:
            raise RecordNotFoundError(f"API key {quoted(key_id)} does not exist")
        if stored.info.revoked_at is not None:
            return stored.info, False
        rows.revoke_key(tx, key_id, now)
        audit.append(tx, "key.revoke", stored.info.tenant, {"key_id": key_id}, at=now, actor=actor)
    return ApiKeyInfo(key_id, stored.info.tenant, stored.info.created_at, now), True


def authenticate(db: Database, token: str) -> Tenant:
    """The tenant a bearer token belongs to; ``AuthenticationError`` otherwise."""
    key_id = keys.key_id_of(token)
    if key_id is None:
        raise AuthenticationError(_BAD_KEY)
    with db.transaction(write=False, serving=True) as tx:  # a tenant request's
        stored = rows.get_key(tx, key_id)
        matches = stored is not None and keys.token_matches(token, stored.token_sha256)
        if stored is None or not matches or stored.info.revoked_at is not None:
            raise AuthenticationError(_BAD_KEY)
        return require_tenant(tx, stored.info.tenant)


def _limits(tenant: Tenant) -> dict[str, object]:
    quotas = tenant.quotas
    return {
        "priority": tenant.priority.value,
        "max_gpu_bytes": quotas.max_gpu_bytes,
        "max_cpu_bytes": quotas.max_cpu_bytes,
        "max_disk_bytes": quotas.max_disk_bytes,
        "max_cold_loads": quotas.max_cold_loads,
        "max_requests_per_s": quotas.max_requests_per_s,
        "max_running_seqs": quotas.max_running_seqs,
        "reserved_running_seqs": quotas.reserved_running_seqs,
        "max_kv_blocks": quotas.max_kv_blocks,
    }
