"""The ``operator_pins`` table (schema 8) and the operator's warm-policy mark on ``revisions``.

A row is one operator pin of a revision in a tier (``L0``, ``L1``, ``L2``), with the revision's
content digest when it was pinned. Rows name revisions without a foreign key: ``served_pins``
reads each row beside its revision (outer join), so a row whose revision is gone or holds other
bytes is seen, not hidden.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass

from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.registry.models import Revision
from loraplex.registry.sql.adapters import REVISION_COLUMNS, revision_from_row
from loraplex.registry.sql.db import Tx

_PIN_COLUMNS = "p.tenant, p.name, p.revision, p.tier, p.adapter_digest, p.pinned_at, p.actor"
_JOINED_REVISION = ", ".join(f"v.{column.strip()}" for column in REVISION_COLUMNS.split(","))


@dataclass(frozen=True)
class OperatorPin:
    """One operator pin as the registry records it."""

    tenant: str  # the revision's tenant
    name: str  # its adapter's name
    revision: str  # its revision label
    tier: str  # "L0", "L1" or "L2" (``residency.ledger.Tier`` names)
    adapter_digest: str  # the revision's content digest when it was pinned
    pinned_at: float  # epoch seconds
    actor: str  # who pinned it (the audit log's actor)

    @property
    def ref(self) -> str:
        return f"{self.tenant}/{self.name}@{self.revision}"


@dataclass(frozen=True)
class PinRow:
    """A pin row and what it names now."""

    pin: OperatorPin  # the row
    revision: Revision | None  # the revision it names; None: no such revision (any more)
    tenant_exists: bool  # whether its tenant does


def insert_if_absent(tx: Tx, pin: OperatorPin) -> bool:
    """Records ``pin``; False (nothing written) when that revision and tier is recorded."""
    found = tx.query_one(
        "SELECT 1 FROM operator_pins WHERE tenant = ? AND name = ? AND revision = ? AND tier = ?",
        (pin.tenant, pin.name, pin.revision, pin.tier),
    )
    if found is not None:
        return False
    tx.execute(
        "INSERT INTO operator_pins (tenant, name, revision, tier, adapter_digest, pinned_at, "
        "actor) VALUES (?, ?, ?, ?, ?, ?, ?)",
        astuple(pin),
    )
    return True


def delete(tx: Tx, tenant: str, name: str, revision: str, tier: str) -> bool:
    """Removes the pin of that revision and tier; False when there was none."""
    found = tx.query_one(
        "SELECT 1 FROM operator_pins WHERE tenant = ? AND name = ? AND revision = ? AND tier = ?",
        (tenant, name, revision, tier),
    )
    if found is None:
        return False
    tx.execute(
        "DELETE FROM operator_pins WHERE tenant = ? AND name = ? AND revision = ? AND tier = ?",
        (tenant, name, revision, tier),
    )
    return True


def all_rows(tx: Tx) -> list[PinRow]:
    """Every pin row beside its revision and tenant, by revision then tier."""
    rows = tx.query(
        f"SELECT {_PIN_COLUMNS}, t.name, {_JOINED_REVISION} FROM operator_pins p "
        "LEFT JOIN tenants t ON t.name = p.tenant "
        "LEFT JOIN revisions v "
        "ON v.tenant = p.tenant AND v.name = p.name AND v.revision = p.revision "
        "ORDER BY p.tenant, p.name, p.revision, p.tier"
    )
    found = []
    for row in rows:
        tenant, name, label, tier, digest = (str(value) for value in row[:5])
        pin = OperatorPin(tenant, name, label, tier, digest, float(row[5]), str(row[6]))
        revision = None if row[8] is None else revision_from_row(tuple(row[8:]))
        found.append(PinRow(pin, revision, row[7] is not None))
    return found


def mark_warm_by_operator(tx: Tx, rev: Revision) -> None:
    """The revision's warm policy is an operator's from now on (its ``on_demand`` too)."""
    tx.execute(
        "UPDATE revisions SET warm_by_operator = 1 WHERE tenant = ? AND name = ? AND revision = ?",
        (rev.tenant, rev.name, rev.revision),
    )


def operator_warm(tx: Tx, base_digest: str) -> list[Revision]:
    """The revisions of ``base_digest`` whose warm policy the cache must be told: every one
    other than ``on_demand``, and an operator's ``on_demand``."""
    rows = tx.query(
        f"SELECT {REVISION_COLUMNS} FROM revisions WHERE base_digest = ? "
        "AND (warm_policy <> ? OR warm_by_operator = 1) ORDER BY tenant, name, revision",
        (base_digest, WarmPolicy.ON_DEMAND.value),
    )
    return [revision_from_row(row) for row in rows]
