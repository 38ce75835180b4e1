"""Operator pins in the registry, so they outlive a server restart (schema 8).

The server records an operator's ``/admin/residency/pin`` here before its cache pins, removes it
on unpin, and reads the pins back at start (``restore``) before it takes requests. A release's
holds are not recorded here: the release rows are their record. Each change writes its audit
row in the same transaction (``residency.pin``, ``residency.unpin``, ``residency.pin_dropped``).
"""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.errors import quoted
from loraplex.registry.models import Revision
from loraplex.registry.releases import require_revision
from loraplex.registry.sql import audit
from loraplex.registry.sql import operator_pins as rows
from loraplex.registry.sql.db import Database
from loraplex.registry.sql.operator_pins import OperatorPin, PinRow

# ``residency.ledger.Tier`` names a pin may hold (L3, the artifact store, is never pinned); the
# registry cannot import residency, a test keeps the two equal.
PIN_TIERS = ("L0", "L1", "L2")


@dataclass(frozen=True)
class ServedPin:
    """A recorded pin of a revision this server serves."""

    revision: Revision  # the pinned revision (its ``key()`` is what the cache pins)
    tier: str  # one of ``PIN_TIERS``


@dataclass(frozen=True)
class RestoredPins:
    """What ``restore`` found in the registry at start."""

    served: tuple[ServedPin, ...]  # pins of revisions of the served base model: pin them
    dropped: tuple[tuple[OperatorPin, str], ...]  # removed from the registry, each with why
    other_base: tuple[OperatorPin, ...]  # kept: revisions of another base model


def check_tier(tier: str) -> None:
    if tier not in PIN_TIERS:
        raise ValueError(f"tier {quoted(tier)} is invalid; expected one of {', '.join(PIN_TIERS)}")


def record(db: Database, ref: tuple[str, str, str], tier: str, *, actor: str, now: float) -> bool:
    """Records the operator's pin of ``ref`` (tenant, name, revision) in ``tier``; False when it
    was recorded already (nothing written). ``AdapterNotFoundError`` for an unknown revision."""
    check_tier(tier)
    with db.transaction() as tx:
        revision = require_revision(tx, *ref)
        pin = OperatorPin(*ref, tier, revision.adapter_digest, now, actor)
        if not rows.insert_if_absent(tx, pin):
            return False
        audit.append(tx, "residency.pin", revision.ref, {"tier": tier}, at=now, actor=actor)
    return True


def remove(db: Database, ref: tuple[str, str, str], tier: str, *, actor: str, now: float) -> bool:
    """Removes the operator's pin of ``ref`` in ``tier``; False when none was recorded."""
    check_tier(tier)
    with db.transaction() as tx:
        if not rows.delete(tx, *ref, tier):
            return False
        subject = f"{ref[0]}/{ref[1]}@{ref[2]}"
        audit.append(tx, "residency.unpin", subject, {"tier": tier}, at=now, actor=actor)
    return True


def served(db: Database, base_digest: str) -> list[ServedPin]:
    """The recorded pins a server of ``base_digest`` holds (read only: ``restore`` drops the
    others at the server's start)."""
    with db.transaction(write=False) as tx:
        found = rows.all_rows(tx)
    return list(_sorted(found, base_digest).served)


def restore(db: Database, base_digest: str, *, actor: str, now: float) -> RestoredPins:
    """Every recorded pin, sorted: those of ``base_digest``'s revisions to pin, those of another
    base model's kept, and those whose revision, tenant or content is gone dropped (each with an
    audit row); a database without one to drop is only read."""
    with db.transaction(write=False) as tx:
        found = rows.all_rows(tx)
    if not _sorted(found, base_digest).dropped:
        return _sorted(found, base_digest)
    with db.transaction() as tx:
        restored = _sorted(rows.all_rows(tx), base_digest)  # again, under the write lock
        for pin, why in restored.dropped:
            rows.delete(tx, pin.tenant, pin.name, pin.revision, pin.tier)
            details: dict[str, object] = {"tier": pin.tier, "reason": why}
            audit.append(tx, "residency.pin_dropped", pin.ref, details, at=now, actor=actor)
    return restored


def _sorted(found: list[PinRow], base_digest: str) -> RestoredPins:
    dropped, served, other = [], [], []
    for row in found:
        why = _problem(row)
        if why is not None:
            dropped.append((row.pin, why))
        elif row.revision is not None and row.revision.base_digest == base_digest:
            served.append(ServedPin(row.revision, row.pin.tier))
        else:
            other.append(row.pin)
    return RestoredPins(tuple(served), tuple(dropped), tuple(other))


def _problem(row: PinRow) -> str | None:
    """Why ``row`` can no longer be pinned; None when it can."""
    if not row.tenant_exists:
        return f"tenant {quoted(row.pin.tenant)} no longer exists"
    if row.revision is None:
        return f"revision {row.pin.ref} no longer exists"
    if row.revision.adapter_digest != row.pin.adapter_digest:
        return f"revision {row.pin.ref} now holds other bytes than those pinned"
    if row.pin.tier not in PIN_TIERS:
        return f"tier {quoted(row.pin.tier)} is not one a pin may hold"
    return None
