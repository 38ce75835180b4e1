"""Release metadata of existing adapters: visibility, revision state and warm policy, aliases.

Revision content never changes here (the database refuses it); only what the release flow moves:
which revisions an alias routes to with which weights, its history (what rollbacks return to, one
step per rollback), and each revision's state and warm policy. Each change writes its audit row
in the same transaction.
"""

from __future__ import annotations

from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.errors import AdapterNotFoundError, RegistryError, clipped, quoted
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
from loraplex.registry.sql import releases as release_rows
from loraplex.registry.sql.db import Database, Tx
from loraplex.registry.sql.operator_pins import mark_warm_by_operator

MAX_ALIAS_TARGETS = 64  # revisions one alias splits its traffic between
MAX_ALIAS_WEIGHT = 1 << 31  # one target's relative weight


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
        if new_state is RevisionState.DEPRECATED and current.state is not new_state:
            _require_not_released(tx, current)
        new_policy = current.warm_policy if warm_policy is None else warm_policy
        rows.set_revision_release(tx, current, new_state, new_policy)
        if warm_policy is not None:  # an operator's, ``on_demand`` too (automatic: off)
            mark_warm_by_operator(tx, current)
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
    """Point ``tenant/name`` at ``targets``; the previous targets go on the alias's history."""
    with db.transaction() as tx:
        _require_no_release(tx, tenant, name)
        return set_alias_in(tx, tenant, name, targets, actor=actor, now=now)


def set_alias_in(
    tx: Tx,
    tenant: str,
    name: str,
    targets: tuple[AliasTarget, ...],
    *,
    actor: str,
    now: float,
    action: str = "alias.set",
) -> Alias:
    """``set_alias`` inside the caller's transaction (a release's promotion is one)."""
    _check_targets(targets)
    require_adapter(tx, tenant, name)
    _require_servable(tx, tenant, name, targets)
    previous = rows.get_alias(tx, tenant, name)
    if previous is not None:
        rows.push_history(tx, tenant, name, previous.targets, now)
    rollback = () if previous is None else previous.targets
    alias = Alias(tenant, name, targets, rollback, now)
    rows.put_alias(tx, alias)
    audit.append(tx, action, f"{tenant}/{name}", _alias_details(alias), at=now, actor=actor)
    return alias


def rollback_alias(db: Database, tenant: str, name: str, *, actor: str, now: float) -> Alias:
    """Return the alias to the targets it had before its last change; each rollback goes one
    step further back through the history (a second rollback does not undo the first)."""
    with db.transaction() as tx:
        _require_no_release(tx, tenant, name)
        return rollback_alias_in(tx, tenant, name, actor=actor, now=now)


def rollback_alias_in(
    tx: Tx, tenant: str, name: str, *, actor: str, now: float, action: str = "alias.rollback"
) -> Alias:
    """``rollback_alias`` inside the caller's transaction."""
    require_adapter(tx, tenant, name)
    current = rows.get_alias(tx, tenant, name)
    if current is None or not current.rollback_targets:
        raise RegistryError(f"alias {tenant}/{name} has no rollback target")
    _require_servable(tx, tenant, name, current.rollback_targets)
    popped = rows.pop_history(tx, tenant, name)
    # NOTE: rollback_targets mirrors the top of the history; the popped entry is that top.
    targets = current.rollback_targets if popped is None else popped
    # NOTE: the new top only (LIMIT 1): reading the whole history made each rollback cost
    # time in its length, a tenant's thousands of alias flips slowing every rollback of it
    below = rows.history_top(tx, tenant, name) or ()
    alias = Alias(tenant, name, targets, below, now)
    rows.put_alias(tx, alias)
    audit.append(tx, action, f"{tenant}/{name}", _alias_details(alias), at=now, actor=actor)
    return alias


def alias_history(
    db: Database, tenant: str, name: str
) -> list[tuple[tuple[AliasTarget, ...], float]]:
    """Earlier targets of the alias, newest first, with when each was replaced."""
    with db.transaction(write=False) as tx:
        require_adapter(tx, tenant, name)
        return rows.alias_history(tx, tenant, name)


def _check_targets(targets: tuple[AliasTarget, ...]) -> None:
    """NOTE: every request through the alias reads each target's revision, and a weight past a
    BIGINT's range failed to write on some paths; checked on writes only, so an alias stored
    before these bounds still reads."""
    if len(targets) > MAX_ALIAS_TARGETS:
        raise ValueError(
            f"targets has {len(targets)} entries; expected at most {MAX_ALIAS_TARGETS}"
        )
    for target in targets:
        if target.weight > MAX_ALIAS_WEIGHT:
            raise ValueError(
                f"weight {quoted(target.weight)} of {target.revision} is invalid; expected 1 to "
                f"{MAX_ALIAS_WEIGHT}"
            )


def _require_no_release(tx: Tx, tenant: str, name: str) -> None:
    """While a release owns an alias, only the release moves it (else its baseline, holds and
    comparison would describe an alias that no longer exists)."""
    release_id = release_rows.active_release_id(tx, tenant, name)
    if release_id is not None:
        raise RegistryError(
            f"alias {tenant}/{name} is being released by {release_id}; finish, roll back or "
            "abort that release before moving the alias by hand"
        )


def _require_not_released(tx: Tx, revision: Revision) -> None:
    """A live release's revisions stay servable (docs/releases.md): resolution skips deprecated
    ones, so a deprecated candidate's callers went back to stable unseen while the release stayed
    in canary, and a deprecated baseline left every caller outside the canary a 404."""
    release = release_rows.active_release_holding(
        tx, revision.tenant, revision.name, revision.revision
    )
    if release is not None:
        raise RegistryError(
            f"revision {revision.ref} is under release {release} (its candidate or baseline); "
            "roll back or abort that release before deprecating it"
        )


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
