"""The release graph (see ``model.py``) and what each transition does to the alias.

A transition is one transaction: the release row, the alias change it implies and the audit
row commit together or not at all, so a crash between any two statements leaves either the
state before or the state after.
"""

from __future__ import annotations

from loraplex.registry import releases as alias_ops
from loraplex.registry.models import AliasTarget, RevisionState
from loraplex.registry.sql import adapters as rows
from loraplex.registry.sql.db import Tx
from loraplex.release.errors import InvalidTransitionError
from loraplex.release.model import Release, ReleaseState

S = ReleaseState
_LEAVE = frozenset({S.ABORTED, S.ROLLED_BACK})
EDGES: dict[ReleaseState, frozenset[ReleaseState]] = {
    S.STAGED: frozenset({S.PREWARMING}) | _LEAVE,
    S.PREWARMING: frozenset({S.PROBING}) | _LEAVE,
    S.PROBING: frozenset({S.CANARY}) | _LEAVE,
    S.CANARY: frozenset({S.CANARY, S.PROMOTED}) | _LEAVE,  # canary -> canary: next ladder step
    S.PROMOTED: frozenset({S.ROLLED_BACK}),  # operator only, see model.py
    S.ROLLED_BACK: frozenset(),
    S.ABORTED: frozenset(),
}


def check_transition(release: Release, to: ReleaseState) -> None:
    if to not in EDGES[release.state]:
        allowed = ", ".join(sorted(state.value for state in EDGES[release.state])) or "nothing"
        raise InvalidTransitionError(
            f"release {release.release_id} of {release.alias_ref} is {release.state.value}; "
            f"it cannot move to {to.value} (from {release.state.value}: {allowed})"
        )


def apply_alias_effects(
    tx: Tx, release: Release, to: ReleaseState, *, actor: str, now: float
) -> None:
    """The alias side of a transition, inside its transaction. Canary traffic needs nothing
    here: resolution reads the release row itself, so leaving canary ends it in the same commit."""
    if to is S.PROMOTED:
        candidate = rows.get_revision(tx, release.tenant, release.name, release.candidate)
        if candidate is not None and candidate.state is not RevisionState.STABLE:
            rows.set_revision_release(tx, candidate, RevisionState.STABLE, candidate.warm_policy)
        alias_ops.set_alias_in(
            tx,
            release.tenant,
            release.name,
            (AliasTarget(release.candidate, 1),),
            actor=actor,
            now=now,
            action="alias.promote",
        )
    elif to is S.ROLLED_BACK and release.state is S.PROMOTED:
        alias = rows.get_alias(tx, release.tenant, release.name)
        if alias is None or [t.revision for t in alias.targets] != [release.candidate]:
            raise InvalidTransitionError(
                f"alias {release.alias_ref} no longer points at {release.candidate} alone; "
                "it was moved after the promotion, so rolling the release back would undo "
                "that move (use `adapters alias rollback`)"
            )
        alias_ops.rollback_alias_in(
            tx, release.tenant, release.name, actor=actor, now=now, action="alias.rollback"
        )
