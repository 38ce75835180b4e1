"""The append-only ``audit_log`` table (database triggers refuse UPDATE and DELETE)."""

from __future__ import annotations

import json

from loraplex.registry.models import AuditEntry
from loraplex.registry.sql.db import Tx


def append(
    tx: Tx, action: str, subject: str, details: dict[str, object], *, at: float, actor: str
) -> None:
    """Record one administrative change; call it inside the change's own transaction."""
    tx.execute(
        "INSERT INTO audit_log (at, actor, action, subject, details) VALUES (?, ?, ?, ?, ?)",
        (at, actor, action, subject, json.dumps(details, sort_keys=True)),
    )


def entries(tx: Tx, after_seq: int = 0, limit: int = 1000) -> list[AuditEntry]:
    """Entries with ``seq > after_seq``, oldest first."""
    rows = tx.query(
        "SELECT seq, at, actor, action, subject, details FROM audit_log "
        "WHERE seq > ? ORDER BY seq LIMIT ?",
        (after_seq, limit),
    )
    return [
        AuditEntry(
            seq=int(row[0]),
            at=float(row[1]),
            actor=str(row[2]),
            action=str(row[3]),
            subject=str(row[4]),
            details=dict(json.loads(row[5])),
        )
        for row in rows
    ]
