"""Rows of ``trust_policies`` and ``trust_anchors`` <-> ``TrustPolicy`` / ``TrustAnchor``."""

from __future__ import annotations

import json
from collections.abc import Sequence

from loraplex.artifacts.signature import AnchorKind, AnchorLookup
from loraplex.registry.sql.db import Row, Tx
from loraplex.registry.trust_models import PolicyKind, TrustAnchor, TrustPolicy

_ANCHOR_COLUMNS = "tenant, name, kind, pem, fingerprint, added_at"


def get_policy(tx: Tx, tenant: str) -> TrustPolicy:
    """The tenant's policy; ``none`` when never set (today's behaviour)."""
    row = tx.query_one(
        "SELECT policy, identities, updated_at FROM trust_policies WHERE tenant = ?", (tenant,)
    )
    if row is None:
        return TrustPolicy(tenant, PolicyKind.NONE, (), None)
    identities = tuple(str(i) for i in json.loads(str(row[1])))
    return TrustPolicy(tenant, PolicyKind(row[0]), identities, float(row[2]))


def put_policy(tx: Tx, policy: TrustPolicy, now: float) -> None:
    tx.execute("DELETE FROM trust_policies WHERE tenant = ?", (policy.tenant,))
    tx.execute(
        "INSERT INTO trust_policies (tenant, policy, identities, updated_at) VALUES (?, ?, ?, ?)",
        (policy.tenant, policy.kind.value, json.dumps(list(policy.identities)), now),
    )


def list_anchors(tx: Tx, tenant: str) -> list[TrustAnchor]:
    rows = tx.query(
        f"SELECT {_ANCHOR_COLUMNS} FROM trust_anchors WHERE tenant = ? ORDER BY name", (tenant,)
    )
    return [_anchor(row) for row in rows]


def find_anchors(tx: Tx, tenant: str, lookup: AnchorLookup) -> list[TrustAnchor]:
    """The tenant's anchors of ``lookup.kind`` whose key id it names (by the index on
    ``(tenant, key_id)``, never every anchor's PEM), and any without a key id yet."""
    where, params = "tenant = ? AND kind = ?", [tenant, lookup.kind.value]
    if lookup.key_ids is not None:
        ids = sorted(lookup.key_ids)
        named = f"key_id IN ({', '.join('?' * len(ids))}) OR " if ids else ""
        where += f" AND ({named}key_id IS NULL)"
        params += ids
    rows = tx.query(
        f"SELECT {_ANCHOR_COLUMNS} FROM trust_anchors WHERE {where} ORDER BY name", params
    )
    return [_anchor(row) for row in rows]


def count_anchors(tx: Tx, tenant: str) -> int:
    row = tx.query_one("SELECT COUNT(*) FROM trust_anchors WHERE tenant = ?", (tenant,))
    return 0 if row is None else int(row[0])


def anchors_without_key_id(tx: Tx) -> list[TrustAnchor]:
    """Anchors added before key ids were recorded (schema version 7)."""
    rows = tx.query(f"SELECT {_ANCHOR_COLUMNS} FROM trust_anchors WHERE key_id IS NULL", ())
    return [_anchor(row) for row in rows]


def set_key_id(tx: Tx, tenant: str, name: str, key_id: str) -> None:
    tx.execute(
        "UPDATE trust_anchors SET key_id = ? WHERE tenant = ? AND name = ?", (key_id, tenant, name)
    )


def get_anchor(tx: Tx, tenant: str, name: str) -> TrustAnchor | None:
    row = tx.query_one(
        f"SELECT {_ANCHOR_COLUMNS} FROM trust_anchors WHERE tenant = ? AND name = ?",
        (tenant, name),
    )
    return None if row is None else _anchor(row)


def insert_anchor(tx: Tx, anchor: TrustAnchor, key_id: str) -> None:
    """``key_id``: what a bundle finds it by (``signature.anchor_ids``)."""
    tx.execute(
        f"INSERT INTO trust_anchors ({_ANCHOR_COLUMNS}, key_id) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            anchor.tenant,
            anchor.name,
            anchor.kind.value,
            anchor.pem,
            anchor.fingerprint,
            anchor.added_at,
            key_id,
        ),
    )


def delete_anchor(tx: Tx, tenant: str, name: str) -> None:
    tx.execute("DELETE FROM trust_anchors WHERE tenant = ? AND name = ?", (tenant, name))


def signed_adapters(tx: Tx, tenant: str, names: Sequence[str] | None = None) -> dict[str, bool]:
    """Adapter name -> whether every revision its alias routes to is signed (two queries); with
    ``names``, those adapters only (a page of the model list reads no other's revisions)."""
    if names is not None and not names:
        return {}
    only = "" if names is None else f" AND name IN ({', '.join('?' * len(names))})"
    params = (tenant, *(names or ()))
    signed = {
        (str(row[0]), str(row[1])): row[2] is not None
        for row in tx.query(
            f"SELECT name, revision, signature_digest FROM revisions WHERE tenant = ?{only}",
            params,
        )
    }
    out = {}
    aliases = tx.query(f"SELECT name, targets FROM aliases WHERE tenant = ?{only}", params)
    for name, targets in aliases:
        revisions = [str(t["revision"]) for t in json.loads(str(targets))]
        out[str(name)] = all(signed.get((str(name), r), False) for r in revisions)
    return out


def _anchor(row: Row) -> TrustAnchor:
    return TrustAnchor(
        tenant=str(row[0]),
        name=str(row[1]),
        kind=AnchorKind(row[2]),
        pem=str(row[3]),
        fingerprint=str(row[4]),
        added_at=float(row[5]),
    )
