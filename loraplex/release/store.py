"""``ReleaseStore``: the programmatic API of releases (the CLI and the admin routes call it; the
controller drives it).

Every change is one write transaction holding the release row, the alias change it implies and
its audit row. Write transactions are serialised across processes (``Database.transaction``),
so a check made inside one still holds when it commits; the controller, which decides outside
the transaction, passes what it saw (state, version) and loses with ``ReleaseConflictError``
when someone moved the release meanwhile.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import replace

from loraplex.errors import AdapterNotFoundError
from loraplex.registry import Registry, tenancy
from loraplex.registry import releases as alias_ops
from loraplex.registry.models import Alias, RevisionState
from loraplex.registry.resolution import servable_targets
from loraplex.registry.sql import adapters as adapter_rows
from loraplex.registry.sql import audit
from loraplex.registry.sql.db import Tx
from loraplex.registry.sql.paging import Page
from loraplex.release import machine, rows
from loraplex.release.errors import (
    InvalidTransitionError,
    ReleaseConflictError,
    ReleaseNotFoundError,
    ReleaseStartError,
)
from loraplex.release.model import Release, ReleasePlan, ReleaseState, check_plan_bounds

S = ReleaseState
_BEFORE_CANARY = frozenset({S.STAGED, S.PREWARMING, S.PROBING})


class ReleaseStore:
    """Releases over one registry's database. Operator methods take the alias
    (``tenant``, ``name``); timestamps come from the registry's wall clock unless given."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self._db = registry.db

    # --- operators -----------------------------------------------------------------------------

    def start_release(
        self, tenant: str, name: str, revision: str, plan: ReleasePlan, *, actor: str
    ) -> Release:
        """Stage a release of ``tenant/name@revision``; the controller takes it from there.
        A plan over the bounds (``model.check_plan_bounds``) is refused before anything is
        read or written."""
        try:
            check_plan_bounds(plan.ladder, plan.probes, plan.durations)
        except ValueError as exc:
            raise ReleaseStartError(str(exc)) from None
        now = self._registry.now()
        with self._db.transaction() as tx:
            baseline = self._check_start(tx, tenant, name, revision)
            release = Release(
                release_id=f"rel-{secrets.token_hex(6)}",
                tenant=tenant,
                name=name,
                candidate=revision,
                baseline=baseline,
                state=S.STAGED,
                step=0,
                plan=plan,
                created_at=now,
                updated_at=now,
                step_started_at=None,
                reason=None,
                actor=actor,
                hold_until=None,
                version=0,
            )
            rows.insert(tx, release)
            _audit(tx, release, None, actor=actor, now=now)
        return release

    def promote(self, tenant: str, name: str, *, actor: str) -> Release:
        """Move the alias to the candidate now, skipping any remaining ladder steps. Only from
        canary: a candidate that has not passed its probes is never promoted."""
        return self._operate(tenant, name, S.PROMOTED, actor, "promoted by operator")

    def rollback(self, tenant: str, name: str, *, actor: str) -> Release:
        """Canary: all traffic back to the stable revision at once. Promoted: the alias back to
        the baseline through its history (instant while the baseline is still held)."""
        return self._operate(tenant, name, S.ROLLED_BACK, actor, "rolled back by operator")

    def abort(self, tenant: str, name: str, *, actor: str) -> Release:
        """Stop a release before it serves canary traffic (in canary: use ``rollback``)."""
        return self._operate(tenant, name, S.ABORTED, actor, "aborted by operator")

    # --- reading -------------------------------------------------------------------------------

    def get_release(self, release_id: str) -> Release:
        with self._db.transaction(write=False) as tx:
            found = rows.get(tx, release_id)
        if found is None:
            raise ReleaseNotFoundError(f"release {release_id} does not exist")
        return found

    def latest_release(self, tenant: str, name: str) -> Release:
        """The alias's active release, else its most recent one."""
        with self._db.transaction(write=False) as tx:
            found = rows.active(tx, tenant, name) or rows.latest(tx, tenant, name)
        if found is None:
            raise ReleaseNotFoundError(f"alias {tenant}/{name} has no release")
        return found

    def list_releases(
        self, *, include_terminal: bool = False, tenant: str | None = None, page: Page | None = None
    ) -> list[Release]:
        """Oldest first: every one, or with ``page`` one bounded page (the admin API's);
        ``tenant`` must exist (``RecordNotFoundError`` naming it, not an empty list)."""
        with self._db.transaction(write=False) as tx:
            if tenant is not None:
                tenancy.require_tenant(tx, tenant)
            return rows.listed(tx, include_terminal=include_terminal, tenant=tenant, page=page)

    def needing_work(self) -> list[Release]:
        with self._db.transaction(write=False) as tx:
            return rows.needing_work(tx)

    # --- the controller ------------------------------------------------------------------------

    def transition(
        self, seen: Release, to: ReleaseState, *, actor: str, now: float, **changes: object
    ) -> Release:
        """Move ``seen`` to ``to`` if it is still exactly as seen (state and version);
        ``changes`` are other ``Release`` fields to set (step, reason, step_started_at, ...)."""
        with self._db.transaction() as tx:
            current = _expect(tx, seen)
            return _move(tx, current, to, actor=actor, now=now, changes=changes)

    def release_hold(self, seen: Release, *, actor: str, now: float) -> Release:
        """The baseline's hold window is over (the controller unpinned it): clear it."""
        with self._db.transaction() as tx:
            current = _expect(tx, seen)
            cleared = replace(current, hold_until=None, version=current.version + 1, updated_at=now)
            rows.update(tx, cleared)
            details: dict[str, object] = {
                "release": current.release_id,
                "baseline": current.baseline,
            }
            audit.append(tx, "release.unhold", current.baseline_ref, details, at=now, actor=actor)
        return cleared

    def save_observation(self, seen: Release, **changes: object) -> Release:
        """Record a comparison or a restarted step start without a transition (the version, the
        compare-and-set token of transitions, stays): no-op when the release has moved on."""
        allowed = {"comparison", "step_started_at"}
        if not set(changes) <= allowed:
            raise ValueError(f"changes {sorted(changes)} are invalid; expected {sorted(allowed)}")
        updated = replace(seen, **changes)  # type: ignore[arg-type]
        with self._db.transaction() as tx:
            current = rows.get(tx, seen.release_id)
            if current is None or (current.state, current.version) != (seen.state, seen.version):
                return current or seen
            rows.update(tx, updated)
        return updated

    # --- internals -----------------------------------------------------------------------------

    def _check_start(self, tx: Tx, tenant: str, name: str, revision: str) -> str:
        """The baseline (the alias's highest-weight target that resolution serves) after every
        start check."""
        alias_ops.require_adapter(tx, tenant, name)
        candidate = adapter_rows.get_revision(tx, tenant, name, revision)
        if candidate is None:
            raise AdapterNotFoundError(f"revision {tenant}/{name}@{revision} does not exist")
        if candidate.state is RevisionState.DEPRECATED:
            raise ReleaseStartError(
                f"revision {candidate.ref} is deprecated; expected canary or stable"
            )
        base = self._registry.base_digest
        if base is not None and candidate.base_digest != base:
            raise ReleaseStartError(
                f"revision {candidate.ref} was built for base model {candidate.base_digest}; "
                f"the served base is {base}"
            )
        alias = adapter_rows.get_alias(tx, tenant, name)
        if alias is None:
            raise ReleaseStartError(f"alias {tenant}/{name} has no targets; set one first")
        if revision in {t.revision for t in alias.targets}:
            raise ReleaseStartError(f"alias {tenant}/{name} already routes to {revision}")
        running = rows.active(tx, tenant, name)
        if running is not None:
            raise ReleaseStartError(
                f"alias {tenant}/{name} already has release {running.release_id} "
                f"({running.state.value}); finish, roll back or abort it first"
            )
        # NOTE: among the targets resolution serves: the heaviest one deprecated (an alias may
        # keep one beside a servable target), no caller outside the canary was sent to it and
        # every step compared the candidate with its empty window.
        served = [target for target, _ in servable_targets(tx, alias, base)]
        if not served:
            raise ReleaseStartError(
                f"alias {tenant}/{name} serves no revision (every target is deprecated or built "
                "for another base model); set a servable target first"
            )
        return max(served, key=lambda t: t.weight).revision

    def _operate(
        self, tenant: str, name: str, to: ReleaseState, actor: str, reason: str
    ) -> Release:
        now = self._registry.now()
        with self._db.transaction() as tx:
            current = rows.active(tx, tenant, name)
            if current is None and to is S.ROLLED_BACK:
                # rollback at any depth: each one undoes the newest promotion still standing,
                # so a second rollback goes back through the release before
                current = rows.latest_promoted(tx, tenant, name)
            current = current or rows.latest(tx, tenant, name)
            if current is None:
                raise ReleaseNotFoundError(f"alias {tenant}/{name} has no release")
            _check_operator(current, to, alias_rows=adapter_rows.get_alias(tx, tenant, name))
            return _move(tx, current, to, actor=actor, now=now, changes={"reason": reason})


def _check_operator(release: Release, to: ReleaseState, alias_rows: Alias | None = None) -> None:
    """Which operator commands apply where (narrower than the graph: ``abort`` is for before
    canary traffic, ``promote`` only from canary). ``alias_rows``: the alias now, so a refused
    rollback points to ``adapters alias rollback`` only while it has somewhere to go."""
    permitted: dict[ReleaseState, Callable[[ReleaseState], bool]] = {
        S.ABORTED: lambda state: state in _BEFORE_CANARY,
        S.PROMOTED: lambda state: state is S.CANARY,
        S.ROLLED_BACK: lambda state: state in {S.CANARY, S.PROMOTED},
    }
    if not permitted[to](release.state):
        verb = {S.ABORTED: "abort", S.PROMOTED: "promote", S.ROLLED_BACK: "rollback"}[to]
        hint = {
            S.ABORTED: "abort applies before canary (staged, prewarming, probing)",
            S.PROMOTED: "promote applies in canary",
            S.ROLLED_BACK: "rollback applies in canary or after promotion",
        }[to]
        if to is S.ROLLED_BACK and release.state in (S.ROLLED_BACK, S.ABORTED):
            hint += ", and no promotion of this alias is left to roll back; "
            # NOTE: it named `adapters alias rollback` always, which then failed with "no
            # rollback target" on an alias whose history the release rollbacks had used up
            if alias_rows is not None and alias_rows.rollback_targets:
                hint += (
                    f"`loraplex adapters alias rollback {release.alias_ref}` moves it further "
                    "back through its history"
                )
            else:
                hint += (
                    "the alias keeps no earlier targets either (`loraplex adapters alias set "
                    f"{release.alias_ref} REVISION` moves it)"
                )
        raise InvalidTransitionError(
            f"release {release.release_id} of {release.alias_ref} is {release.state.value}; "
            f"cannot {verb}: {hint}"
        )


def _expect(tx: Tx, seen: Release) -> Release:
    current = rows.get(tx, seen.release_id)
    if current is None:
        raise ReleaseNotFoundError(f"release {seen.release_id} does not exist")
    if (current.state, current.version) != (seen.state, seen.version):
        raise ReleaseConflictError(
            f"release {seen.release_id} moved to {current.state.value} (version "
            f"{current.version}) since it was read as {seen.state.value} (version {seen.version})"
        )
    return current


def _move(
    tx: Tx,
    current: Release,
    to: ReleaseState,
    *,
    actor: str,
    now: float,
    changes: dict[str, object],
) -> Release:
    machine.check_transition(current, to)
    machine.apply_alias_effects(tx, current, to, actor=actor, now=now)
    hold = current.hold_until
    if to in (S.PROMOTED, S.ROLLED_BACK) and current.state is not S.PROMOTED:
        hold = now + current.plan.window_s
    elif to is S.ABORTED:
        hold = now  # nothing to keep: the controller unpins at its next tick
    fields: dict[str, object] = {"hold_until": hold, **changes}
    moved = replace(current, state=to, version=current.version + 1, updated_at=now, **fields)  # type: ignore[arg-type]
    rows.update(tx, moved)
    _audit(tx, moved, current.state, actor=actor, now=now)
    return moved


def _audit(
    tx: Tx, release: Release, before: ReleaseState | None, *, actor: str, now: float
) -> None:
    details: dict[str, object] = {
        "release": release.release_id,
        "from": None if before is None else before.value,
        "to": release.state.value,
        "step": release.step,
        "reason": release.reason,
    }
    action = "release.start" if before is None else f"release.{release.state.value}"
    audit.append(tx, action, release.candidate_ref, details, at=now, actor=actor)
