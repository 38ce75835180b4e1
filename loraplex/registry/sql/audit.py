"""The append-only ``audit_log`` table (database triggers refuse UPDATE and DELETE)."""

from __future__ import annotations

import json

from loraplex.errors import quoted
from loraplex.registry.models import AuditEntry
from loraplex.registry.sql.db import Tx

MAX_AUDIT_PAGE = 1000  # entries one read returns at most
MAX_SEQ = (1 << 63) - 1  # the largest position a BIGINT holds


def append(
    tx: Tx, action: str, subject: str, details: dict[str, object], *, at: float, actor: str
) -> None:
    """Record one administrative change; call it inside the change's own transaction."""
    tx.execute(
        "INSERT INTO audit_log (at, actor, action, subject, details) VALUES (?, ?, ?, ?, ?)",
        (at, actor, action, subject, json.dumps(details, sort_keys=True)),
    )


def entries(tx: Tx, after_seq: int = 0, limit: int = 1000) -> list[AuditEntry]:
    """Entries with ``seq > after_seq``, oldest first. NOTE: checked here: SQLite reads a
    negative LIMIT as none (the whole log in one answer), PostgreSQL refuses it, and a position
    past a BIGINT overflowed the driver (both a 500 on the admin API)."""
    if not 1 <= limit <= MAX_AUDIT_PAGE:
        raise ValueError(f"limit {quoted(limit)} is invalid; expected 1 to {MAX_AUDIT_PAGE}")
    if not 0 <= after_seq <= MAX_SEQ:
        raise ValueError(f"after_seq {quoted(after_seq)} is invalid; expected 0 to {MAX_SEQ}")
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
