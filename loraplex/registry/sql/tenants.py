"""Rows of ``tenants`` and ``api_keys`` <-> ``Tenant`` / ``ApiKeyInfo``."""

from __future__ import annotations

import math
from dataclasses import dataclass

from loraplex.errors import quoted
from loraplex.registry.models import ApiKeyInfo, PriorityClass, Tenant, TenantQuotas
from loraplex.registry.sql import paging
from loraplex.registry.sql.db import Row, Tx
from loraplex.registry.sql.paging import Page, position_names, unknown_cursor

_TENANT_COLUMNS = (
    "name, priority, max_gpu_bytes, max_cpu_bytes, max_disk_bytes, max_cold_loads, "
    "max_requests_per_s, created_at, max_running_seqs, reserved_running_seqs, max_kv_blocks"
)
_KEY_COLUMNS = "key_id, tenant, created_at, revoked_at"


@dataclass(frozen=True)
class StoredKey:
    """An API key row as authentication needs it."""

    info: ApiKeyInfo  # the key as listed
    token_sha256: str  # hash of the token, compared in constant time


def insert_tenant(tx: Tx, tenant: Tenant) -> None:
    quotas = tenant.quotas
    tx.execute(
        f"INSERT INTO tenants ({_TENANT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            tenant.name,
            tenant.priority.value,
            quotas.max_gpu_bytes,
            quotas.max_cpu_bytes,
            quotas.max_disk_bytes,
            quotas.max_cold_loads,
            quotas.max_requests_per_s,
            tenant.created_at,
            quotas.max_running_seqs,
            quotas.reserved_running_seqs,
            quotas.max_kv_blocks,
        ),
    )


def update_tenant(tx: Tx, tenant: Tenant) -> None:
    quotas = tenant.quotas
    tx.execute(
        "UPDATE tenants SET priority = ?, max_gpu_bytes = ?, max_cpu_bytes = ?, "
        "max_disk_bytes = ?, max_cold_loads = ?, max_requests_per_s = ?, max_running_seqs = ?, "
        "reserved_running_seqs = ?, max_kv_blocks = ? WHERE name = ?",
        (
            tenant.priority.value,
            quotas.max_gpu_bytes,
            quotas.max_cpu_bytes,
            quotas.max_disk_bytes,
            quotas.max_cold_loads,
            quotas.max_requests_per_s,
            quotas.max_running_seqs,
            quotas.reserved_running_seqs,
            quotas.max_kv_blocks,
            tenant.name,
        ),
    )


def get_tenant(tx: Tx, name: str) -> Tenant | None:
    row = tx.query_one(f"SELECT {_TENANT_COLUMNS} FROM tenants WHERE name = ?", (name,))
    return None if row is None else _tenant(row)


def list_tenants(tx: Tx, page: Page | None = None) -> list[Tenant]:
    """By name; with ``page``, at most ``page.limit`` after the name ``page.after`` (it need
    not exist: the order is the key's)."""
    where: list[str] = []
    params: list[object] = []
    if page is not None and page.after is not None:
        (after,) = position_names(page.after, 1)
        where, params = ["name > ?"], [after]
    rows = paging.select(
        tx,
        f"{_TENANT_COLUMNS} FROM tenants",
        where=where,
        params=params,
        order_by="name",
        page=page,
    )
    return [_tenant(row) for row in rows]


def insert_key(tx: Tx, key: ApiKeyInfo, token_sha256: str) -> None:
    tx.execute(
        "INSERT INTO api_keys (key_id, tenant, token_sha256, created_at, revoked_at) "
        "VALUES (?, ?, ?, ?, ?)",
        (key.key_id, key.tenant, token_sha256, key.created_at, key.revoked_at),
    )


def get_key(tx: Tx, key_id: str) -> StoredKey | None:
    row = tx.query_one(
        f"SELECT {_KEY_COLUMNS}, token_sha256 FROM api_keys WHERE key_id = ?", (key_id,)
    )
    return None if row is None else StoredKey(_key(row), str(row[4]))


def list_keys(tx: Tx, tenant: str | None, page: Page | None = None) -> list[ApiKeyInfo]:
    """By (tenant, created_at, key_id); with ``page``, at most ``page.limit`` after the key
    ``page.after`` (which must exist, and be ``tenant``'s when the listing names one: a typo
    or another tenant's key is a 400, not an empty page)."""
    where, params = ([], []) if tenant is None else (["tenant = ?"], [tenant])
    if page is not None and page.after is not None:
        cursor = tx.query_one(
            "SELECT tenant, created_at FROM api_keys WHERE key_id = ?", (page.after,)
        )
        if cursor is None:
            raise unknown_cursor(page.after, "key")
        if tenant is not None and cursor[0] != tenant:
            # NOTE: the order leads with the tenant, so another tenant's key sat before or
            # after every row of this listing: an empty page (or the whole one), not a 400
            raise unknown_cursor(page.after, f"key of tenant {quoted(tenant)}")
        where.append(
            "tenant >= ? AND (tenant > ? OR (created_at >= ? AND (created_at > ? OR key_id > ?)))"
        )
        params += [cursor[0], cursor[0], cursor[1], cursor[1], page.after]
    order_by = "tenant, created_at, key_id"
    rows = paging.select(
        tx,
        f"{_KEY_COLUMNS} FROM api_keys",
        where=where,
        params=params,
        order_by=order_by,
        page=page,
    )
    return [_key(row) for row in rows]


def revoke_key(tx: Tx, key_id: str, at: float) -> None:
    tx.execute(
        "UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL", (at, key_id)
    )


def _tenant(row: Row) -> Tenant:
    return Tenant(
        name=str(row[0]),
        priority=PriorityClass(row[1]),
        quotas=TenantQuotas(
            max_gpu_bytes=_opt_int(row[2]),
            max_cpu_bytes=_opt_int(row[3]),
            max_disk_bytes=_opt_int(row[4]),
            max_cold_loads=_opt_int(row[5]),
            max_requests_per_s=_rate(row[6]),
            max_running_seqs=_opt_int(row[8]),
            reserved_running_seqs=_opt_int(row[9]) or 0,
            max_kv_blocks=_opt_int(row[10]),
        ),
        created_at=float(row[7]),
    )


def _rate(value: object) -> float | None:
    """A stored rate; an infinite one (the CLI of earlier versions took ``inf``) is unlimited,
    what it meant, so a registry holding one still reads."""
    rate = None if value is None else float(value)  # type: ignore[arg-type]
    return None if rate is not None and math.isinf(rate) else rate


def _key(row: Row) -> ApiKeyInfo:
    return ApiKeyInfo(
        key_id=str(row[0]),
        tenant=str(row[1]),
        created_at=float(row[2]),
        revoked_at=None if row[3] is None else float(row[3]),
    )


def _opt_int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]
