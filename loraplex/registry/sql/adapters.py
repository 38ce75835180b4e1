"""Rows of ``adapters``, ``revisions``, ``aliases`` and ``alias_history`` <-> their records."""

from __future__ import annotations

import json

from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.registry.models import (
    Adapter,
    Alias,
    AliasTarget,
    Provenance,
    Revision,
    RevisionState,
    Visibility,
)
from loraplex.registry.sql import paging
from loraplex.registry.sql.db import Row, Tx
from loraplex.registry.sql.paging import Page, position_names, unknown_cursor

_ADAPTER_COLUMNS = "tenant, name, visibility, created_at"
REVISION_COLUMNS = (
    "tenant, name, revision, adapter_digest, config_digest, base_digest, compat_version, "
    "max_rank, lora_alpha, use_rslora, target_modules, dtype, tensor_bytes, estimated_bytes, "
    "store_url, created_at, state, warm_policy, probe_prompt, expected_continuation, "
    "signature_digest, signer, trust_anchor, signed_manifest_digest, verified_at"
)
_ALIAS_COLUMNS = "tenant, name, targets, rollback_targets, updated_at"


def insert_adapter_if_absent(tx: Tx, adapter: Adapter) -> bool:
    """Insert the adapter unless it exists; whether it was inserted."""
    if get_adapter(tx, adapter.tenant, adapter.name) is not None:
        return False
    tx.execute(
        f"INSERT INTO adapters ({_ADAPTER_COLUMNS}) VALUES (?, ?, ?, ?)",
        (adapter.tenant, adapter.name, adapter.visibility.value, adapter.created_at),
    )
    return True


def get_adapter(tx: Tx, tenant: str, name: str) -> Adapter | None:
    row = tx.query_one(
        f"SELECT {_ADAPTER_COLUMNS} FROM adapters WHERE tenant = ? AND name = ?", (tenant, name)
    )
    return None if row is None else _adapter(row)


def get_usable_adapter(tx: Tx, caller: str, owner: str, name: str) -> Adapter | None:
    """``owner/name`` if ``caller`` may use it (its own, or public); None otherwise.

    NOTE: visibility is decided in the statement, so a nonexistent adapter and another tenant's
    private one run the same statement and the same Python path (no timing difference).
    """
    row = tx.query_one(
        f"SELECT {_ADAPTER_COLUMNS} FROM adapters "
        "WHERE tenant = ? AND name = ? AND (tenant = ? OR visibility = ?)",
        (owner, name, caller, Visibility.PUBLIC.value),
    )
    return None if row is None else _adapter(row)


def list_adapters(tx: Tx, owner: str | None, page: Page | None = None) -> list[Adapter]:
    """By (tenant, name); with ``page``, at most ``page.limit`` after the adapter
    ``page.after`` (``tenant/name``; it need not exist: the order is the key's)."""
    return _adapters(
        tx, [] if owner is None else ["tenant = ?"], [] if owner is None else [owner], page
    )


def list_usable_adapters(
    tx: Tx,
    caller: str,
    page: Page | None = None,
    *,
    dialect: str,
    base_digest: str | None = None,
) -> list[Adapter]:
    """The caller's own adapters and every public one whose alias serves a revision: exactly
    what ``caller`` may call by name, by (tenant, name); with ``page``, at most ``page.limit``
    after ``page.after`` (``tenant/name``, as ``list_adapters``: a position, so naming an
    adapter the caller may not see tells it nothing). An alias serves when one of its targets
    is not deprecated and, with ``base_digest`` (the served base model), was registered for
    that base: ``resolution.servable_targets``, decided in the statement (``dialect``: the
    JSON functions that read the alias's targets), so a page holds ``page.limit`` such
    adapters however many others lie between them.
    NOTE: every adapter was listed: one whose every alias target was deprecated (or built for
    another base model) was a card that no call could use (the owner was told it serves no
    revision, any other caller the unknown model's 404)."""
    serves, params = _alias_serves(dialect, base_digest)
    return _adapters(
        tx,
        ["(tenant = ? OR visibility = ?)", serves],
        [caller, Visibility.PUBLIC.value, *params],
        page,
    )


# The alias's targets as rows, with the target's revision label (``targets_json``'s objects).
_TARGETS = {
    "sqlite": ("json_each(al.targets) t", "json_extract(t.value, '$.revision')"),
    "postgres": ("json_array_elements(al.targets::json) t", "t.value ->> 'revision'"),
}


def _alias_serves(dialect: str, base_digest: str | None) -> tuple[str, list[object]]:
    """The condition (on a row of ``adapters``) that its alias has a target resolution serves
    (``resolution.servable_targets``), and its parameters."""
    if dialect not in _TARGETS:
        raise ValueError(f"dialect {dialect!r} is invalid; expected one of {sorted(_TARGETS)}")
    targets, label = _TARGETS[dialect]
    base = "" if base_digest is None else " AND v.base_digest = ?"
    condition = (
        f"EXISTS (SELECT 1 FROM aliases al, {targets}, revisions v "
        "WHERE al.tenant = adapters.tenant AND al.name = adapters.name "
        f"AND v.tenant = al.tenant AND v.name = al.name AND v.revision = {label} "
        f"AND v.state <> ?{base})"
    )
    params: list[object] = [RevisionState.DEPRECATED.value]
    return condition, params if base_digest is None else [*params, base_digest]


def _adapters(tx: Tx, where: list[str], params: list[object], page: Page | None) -> list[Adapter]:
    """Adapters where every condition of ``where`` holds, by (tenant, name), and with ``page``
    after its cursor ``tenant/name``."""
    if page is not None and page.after is not None:
        tenant, name = position_names(page.after, 2)
        where = [*where, "tenant >= ? AND (tenant > ? OR name > ?)"]
        params = [*params, tenant, tenant, name]
    rows = paging.select(
        tx,
        f"{_ADAPTER_COLUMNS} FROM adapters",
        where=where,
        params=params,
        order_by="tenant, name",
        page=page,
    )
    return [_adapter(row) for row in rows]


def set_visibility(tx: Tx, tenant: str, name: str, visibility: Visibility) -> None:
    tx.execute(
        "UPDATE adapters SET visibility = ? WHERE tenant = ? AND name = ?",
        (visibility.value, tenant, name),
    )


def insert_revision(tx: Tx, rev: Revision) -> None:
    tx.execute(
        f"INSERT INTO revisions ({REVISION_COLUMNS}) VALUES ({', '.join('?' * 25)})",
        (
            rev.tenant,
            rev.name,
            rev.revision,
            rev.adapter_digest,
            rev.config_digest,
            rev.base_digest,
            rev.compat_version,
            rev.max_rank,
            rev.lora_alpha,
            int(rev.use_rslora),
            json.dumps(list(rev.target_modules)),
            rev.dtype,
            rev.tensor_bytes,
            rev.estimated_bytes,
            rev.store_url,
            rev.created_at,
            rev.state.value,
            rev.warm_policy.value,
            rev.probe_prompt,
            rev.expected_continuation,
            *_provenance_values(rev.provenance),
        ),
    )


def _provenance_values(p: Provenance | None) -> tuple[object, ...]:
    if p is None:
        return (None, None, None, None, None)
    return (p.signature_digest, p.signer, p.trust_anchor, p.manifest_digest, p.verified_at)


def _provenance(row: Row) -> Provenance | None:
    """Columns 20-24 of a revision row (all NULL for an unsigned revision)."""
    if row[20] is None:
        return None
    return Provenance(str(row[20]), str(row[21]), str(row[22]), str(row[23]), float(row[24]))


def get_revision(tx: Tx, tenant: str, name: str, revision: str) -> Revision | None:
    row = tx.query_one(
        f"SELECT {REVISION_COLUMNS} FROM revisions WHERE tenant = ? AND name = ? AND revision = ?",
        (tenant, name, revision),
    )
    return None if row is None else revision_from_row(row)


def list_revisions(tx: Tx, tenant: str, name: str, page: Page | None = None) -> list[Revision]:
    """Oldest first (created_at, revision); with ``page``, at most ``page.limit`` after the
    revision ``page.after`` of this adapter (which must exist: a typo is a 400, not an empty
    page)."""
    where = ["tenant = ?", "name = ?"]
    params: list[object] = [tenant, name]
    if page is not None and page.after is not None:
        cursor = tx.query_one(
            "SELECT created_at FROM revisions WHERE tenant = ? AND name = ? AND revision = ?",
            (tenant, name, page.after),
        )
        if cursor is None:
            raise unknown_cursor(page.after, f"revision of {tenant}/{name}")
        where.append("created_at >= ? AND (created_at > ? OR revision > ?)")
        params += [cursor[0], cursor[0], page.after]
    rows = paging.select(
        tx,
        f"{REVISION_COLUMNS} FROM revisions",
        where=where,
        params=params,
        order_by="created_at, revision",
        page=page,
    )
    return [revision_from_row(row) for row in rows]


def all_revisions(tx: Tx) -> list[Revision]:
    rows = tx.query(f"SELECT {REVISION_COLUMNS} FROM revisions ORDER BY tenant, name, revision")
    return [revision_from_row(row) for row in rows]


def set_revision_release(
    tx: Tx, rev: Revision, state: RevisionState, warm_policy: WarmPolicy
) -> None:
    tx.execute(
        "UPDATE revisions SET state = ?, warm_policy = ? "
        "WHERE tenant = ? AND name = ? AND revision = ?",
        (state.value, warm_policy.value, rev.tenant, rev.name, rev.revision),
    )


def get_alias(tx: Tx, tenant: str, name: str) -> Alias | None:
    row = tx.query_one(
        f"SELECT {_ALIAS_COLUMNS} FROM aliases WHERE tenant = ? AND name = ?", (tenant, name)
    )
    return None if row is None else _alias(row)


def put_alias(tx: Tx, alias: Alias) -> None:
    """Insert or replace the alias of ``alias.tenant/alias.name``."""
    tx.execute("DELETE FROM aliases WHERE tenant = ? AND name = ?", (alias.tenant, alias.name))
    tx.execute(
        f"INSERT INTO aliases ({_ALIAS_COLUMNS}) VALUES (?, ?, ?, ?, ?)",
        (
            alias.tenant,
            alias.name,
            targets_json(alias.targets),
            targets_json(alias.rollback_targets),
            alias.updated_at,
        ),
    )


def push_history(
    tx: Tx, tenant: str, name: str, targets: tuple[AliasTarget, ...], at: float
) -> None:
    """Put ``targets`` on top of the alias's history (what a rollback returns to)."""
    row = tx.query_one(
        "SELECT MAX(seq) FROM alias_history WHERE tenant = ? AND name = ?", (tenant, name)
    )
    seq = 1 if row is None or row[0] is None else int(row[0]) + 1
    tx.execute(
        "INSERT INTO alias_history (tenant, name, seq, targets, pushed_at) VALUES (?, ?, ?, ?, ?)",
        (tenant, name, seq, targets_json(targets), at),
    )


def pop_history(tx: Tx, tenant: str, name: str) -> tuple[AliasTarget, ...] | None:
    """Remove and return the top of the alias's history; None when it is empty."""
    row = tx.query_one(
        "SELECT seq, targets FROM alias_history WHERE tenant = ? AND name = ? "
        "ORDER BY seq DESC LIMIT 1",
        (tenant, name),
    )
    if row is None:
        return None
    tx.execute(
        "DELETE FROM alias_history WHERE tenant = ? AND name = ? AND seq = ?",
        (tenant, name, int(row[0])),
    )
    return _targets(str(row[1]))


def history_top(tx: Tx, tenant: str, name: str) -> tuple[AliasTarget, ...] | None:
    """The top of the alias's history (one row, however long it is); None when it is empty."""
    row = tx.query_one(
        "SELECT targets FROM alias_history WHERE tenant = ? AND name = ? ORDER BY seq DESC LIMIT 1",
        (tenant, name),
    )
    return None if row is None else _targets(str(row[0]))


def alias_history(tx: Tx, tenant: str, name: str) -> list[tuple[tuple[AliasTarget, ...], float]]:
    """The history, newest first: (targets, when they were replaced)."""
    rows = tx.query(
        "SELECT targets, pushed_at FROM alias_history WHERE tenant = ? AND name = ? "
        "ORDER BY seq DESC",
        (tenant, name),
    )
    return [(_targets(str(row[0])), float(row[1])) for row in rows]


def targets_json(targets: tuple[AliasTarget, ...]) -> str:
    return json.dumps([{"revision": t.revision, "weight": t.weight} for t in targets])


def _targets(text: str) -> tuple[AliasTarget, ...]:
    return tuple(AliasTarget(str(t["revision"]), int(t["weight"])) for t in json.loads(text))


def _adapter(row: Row) -> Adapter:
    return Adapter(
        tenant=str(row[0]),
        name=str(row[1]),
        visibility=Visibility(row[2]),
        created_at=float(row[3]),
    )


def revision_from_row(row: Row) -> Revision:
    return Revision(
        tenant=str(row[0]),
        name=str(row[1]),
        revision=str(row[2]),
        adapter_digest=str(row[3]),
        config_digest=str(row[4]),
        base_digest=str(row[5]),
        compat_version=int(row[6]),
        max_rank=int(row[7]),
        lora_alpha=float(row[8]),
        use_rslora=bool(row[9]),
        target_modules=tuple(str(m) for m in json.loads(row[10])),
        dtype=str(row[11]),
        tensor_bytes=int(row[12]),
        estimated_bytes=int(row[13]),
        store_url=str(row[14]),
        created_at=float(row[15]),
        state=RevisionState(row[16]),
        warm_policy=WarmPolicy(row[17]),
        probe_prompt=None if row[18] is None else str(row[18]),
        expected_continuation=None if row[19] is None else str(row[19]),
        provenance=_provenance(row),
    )


def _alias(row: Row) -> Alias:
    return Alias(
        tenant=str(row[0]),
        name=str(row[1]),
        targets=_targets(str(row[2])),
        rollback_targets=_targets(str(row[3])),
        updated_at=float(row[4]),
    )
