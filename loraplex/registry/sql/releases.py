"""What the registry itself reads of the ``releases`` table (the rest is ``loraplex.release``).

Resolution needs one thing per unpinned request: is this alias's release in its canary, and if
so which revision gets which sticky share. Alias changes need to know whether a release owns the
alias right now. Both read through the partial unique index on ``active = 1``.
"""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.registry.models import Revision
from loraplex.registry.sql.adapters import REVISION_COLUMNS, revision_from_row
from loraplex.registry.sql.db import Tx

# ``loraplex.release.model.ReleaseState.CANARY``; the registry layer cannot import it (a test
# keeps the two equal).
CANARY_STATE = "canary"

_JOINED_REVISION = ", ".join(f"v.{column.strip()}" for column in REVISION_COLUMNS.split(","))


@dataclass(frozen=True)
class CanaryRoute:
    """An alias's release while it is in canary: who may be sent to the candidate."""

    share: float  # fraction of callers' draws sent to the candidate, in (0, 1]
    candidate: Revision  # the revision on trial


def canary_route(tx: Tx, tenant: str, name: str) -> CanaryRoute | None:
    """The alias's canary, if its active release is in canary; one indexed read."""
    row = tx.query_one(
        f"SELECT r.state, r.canary_share, {_JOINED_REVISION} "
        "FROM releases r JOIN revisions v "
        "ON v.tenant = r.tenant AND v.name = r.name AND v.revision = r.candidate "
        "WHERE r.tenant = ? AND r.name = ? AND r.active = 1",
        (tenant, name),
    )
    if row is None or row[0] != CANARY_STATE or row[1] is None:
        return None
    return CanaryRoute(float(row[1]), revision_from_row(tuple(row[2:])))


def active_release_id(tx: Tx, tenant: str, name: str) -> str | None:
    row = tx.query_one(
        "SELECT release_id FROM releases WHERE tenant = ? AND name = ? AND active = 1",
        (tenant, name),
    )
    return None if row is None else str(row[0])


def active_release_holding(tx: Tx, tenant: str, name: str, revision: str) -> str | None:
    """``"<release_id> (<state>)"`` of the alias's live release when ``revision`` is its
    candidate or its baseline; else None."""
    row = tx.query_one(
        "SELECT release_id, state FROM releases "
        "WHERE tenant = ? AND name = ? AND active = 1 AND (candidate = ? OR baseline = ?)",
        (tenant, name, revision, revision),
    )
    return None if row is None else f"{row[0]} ({row[1]})"
