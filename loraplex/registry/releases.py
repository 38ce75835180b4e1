"""Release metadata of existing adapters: visibility, revision state and warm policy, aliases.

Revision content never changes here (the database refuses it); only what the release flow moves:
which revisions an alias routes to with which weights, what a rollback returns to, and each
revision's state and warm policy. Each change writes its audit row in the same transaction.
"""

from __future__ import annotations

from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.errors import AdapterNotFoundError, RegistryError, clipped
from loraplex.registry.models import (
    Adapter,
    Alias,
    AliasTarget,
    Revision,
    RevisionState,
    Visibility,
)
from loraplex.registry.sql import adapters as rows
from loraplex.registry.sql import audit
from loraplex.registry.sql.db import Database, Tx


def require_adapter(tx: Tx, tenant: str, name: str) -> Adapter:
    adapter = rows.get_adapter(tx, tenant, name)
    if adapter is None:
        raise AdapterNotFoundError(f"adapter {tenant}/{name} does not exist")
    return adapter


def require_revision(tx: Tx, tenant: str, name: str, revision: str) -> Revision:
    found = rows.get_revision(tx, tenant, name, revision)
    if found is None:
        raise AdapterNotFoundError(f"revision {tenant}/{name}@{revision} does not exist")
    return found


def set_visibility(
    db: Database, tenant: str, name: str, visibility: Visibility, *, actor: str, now: float
) -> Adapter:
    with db.transaction() as tx:
        adapter = require_adapter(tx, tenant, name)
        rows.set_visibility(tx, tenant, name, visibility)
        details: dict[str, object] = {"from": adapter.visibility.value, "to": visibility.value}
        audit.append(tx, "adapter.set_visibility", adapter.ref, details, at=now, actor=actor)
    return Adapter(tenant, name, visibility, adapter.created_at)


def set_release(
    db: Database,
    tenant: str,
    name: str,
    revision: str,
    *,
    state: RevisionState | None,
    warm_policy: WarmPolicy | None,
    actor: str,
    now: float,
) -> Revision:
    """Change a revision's state and/or warm policy (None keeps the current value)."""
    with db.transaction() as tx:
        current = require_revision(tx, tenant, name, revision)
        new_state = current.state if state is None else state
        new_policy = current.warm_policy if warm_policy is None else warm_policy
        rows.set_revision_release(tx, current, new_state, new_policy)
        details: dict[str, object] = {
            "state": [current.state.value, new_state.value],
            "warm_policy": [current.warm_policy.value, new_policy.value],
        }
        audit.append(tx, "revision.set_release", current.ref, details, at=now, actor=actor)
        updated = require_revision(tx, tenant, name, revision)
    return updated


def set_alias(
    db: Database,
    tenant: str,
    name: str,
    targets: tuple[AliasTarget, ...],
    *,
    actor: str,
    now: float,
) -> Alias:
    """Point ``tenant/name`` at ``targets``; the previous targets become the rollback target."""
    with db.transaction() as tx:
        require_adapter(tx, tenant, name)
        _require_servable(tx, tenant, name, targets)
        previous = rows.get_alias(tx, tenant, name)
        rollback = () if previous is None else previous.targets
        alias = Alias(tenant, name, targets, rollback, now)
        rows.put_alias(tx, alias)
        audit.append(
            tx, "alias.set", f"{tenant}/{name}", _alias_details(alias), at=now, actor=actor
        )
    return alias


def rollback_alias(db: Database, tenant: str, name: str, *, actor: str, now: float) -> Alias:
    """Swap an alias back to its rollback target (a second rollback undoes the first)."""
    with db.transaction() as tx:
        require_adapter(tx, tenant, name)
        current = rows.get_alias(tx, tenant, name)
        if current is None or not current.rollback_targets:
            raise RegistryError(f"alias {tenant}/{name} has no rollback target")
        _require_servable(tx, tenant, name, current.rollback_targets)
        alias = Alias(tenant, name, current.rollback_targets, current.targets, now)
        rows.put_alias(tx, alias)
        audit.append(
            tx, "alias.rollback", f"{tenant}/{name}", _alias_details(alias), at=now, actor=actor
        )
    return alias


def _require_servable(tx: Tx, tenant: str, name: str, targets: tuple[AliasTarget, ...]) -> None:
    """Every target must exist, and one at least must not be deprecated: resolution skips
    deprecated targets, so such an alias would turn the adapter into a 404."""
    states = [require_revision(tx, tenant, name, t.revision).state for t in targets]
    if all(state is RevisionState.DEPRECATED for state in states):
        listed = clipped(", ".join(t.revision for t in targets))
        raise RegistryError(
            f"alias {tenant}/{name} targets {listed} are all deprecated; expected at least one "
            "canary or stable revision (an alias of deprecated revisions serves nothing)"
        )


def _alias_details(alias: Alias) -> dict[str, object]:
    return {
        "targets": [[t.revision, t.weight] for t in alias.targets],
        "rollback_targets": [[t.revision, t.weight] for t in alias.rollback_targets],
    }
