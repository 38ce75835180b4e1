"""Rows of ``trust_policies`` and ``trust_anchors`` <-> ``TrustPolicy`` / ``TrustAnchor``."""

from __future__ import annotations

import json
from collections.abc import Sequence

from loraplex.artifacts.signature import AnchorKind
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


def get_anchor(tx: Tx, tenant: str, name: str) -> TrustAnchor | None:
    row = tx.query_one(
        f"SELECT {_ANCHOR_COLUMNS} FROM trust_anchors WHERE tenant = ? AND name = ?",
        (tenant, name),
    )
    return None if row is None else _anchor(row)


def insert_anchor(tx: Tx, anchor: TrustAnchor) -> None:
    tx.execute(
        f"INSERT INTO trust_anchors ({_ANCHOR_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
        (
            anchor.tenant,
            anchor.name,
            anchor.kind.value,
            anchor.pem,
            anchor.fingerprint,
            anchor.added_at,
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
