"""Refuses admin actions that would take a merged revision out from under the engine.

While a revision is merged into the engine's base weights (``mode`` ``auto`` or
``merged:<ref>``, docs/modes.md), deprecating it, or moving its alias off it (a new target set
or a rollback), is refused with a 409 naming it (``MergedRevisionError``): it must be unmerged
first. The engine says what is merged in its published report (``EngineLoad.mode``; behind a
fleet ingress every replica's, ``EngineLoad.replicas_merged``), so the check never waits on it.
An engine that is down has nothing merged: a restarted engine starts unmerged.
"""

from __future__ import annotations

from collections.abc import Iterable

from loraplex.engine.protocol import EngineClient
from loraplex.errors import EngineUnavailableError, MergedRevisionError


def merged_revisions(engine: EngineClient) -> frozenset[str]:
    """``tenant/name@revision`` of every revision merged into base weights behind ``engine``
    now: its own, or in a fleet every replica's (``EngineLoad.merged_revisions``)."""
    try:
        return engine.load_snapshot().merged_revisions
    except EngineUnavailableError:
        return frozenset()


def refuse_if_merged(engine: EngineClient, revisions: Iterable[str], action: str) -> None:
    """Raises ``MergedRevisionError`` when one of ``revisions`` (refs) is merged now."""
    merged = sorted(merged_revisions(engine) & set(revisions))
    if merged:
        raise MergedRevisionError(merged[0], action)


def refuse_moving_off(
    engine: EngineClient, tenant: str, name: str, current: Iterable[str], new: Iterable[str]
) -> None:
    """Refuses an alias change of ``tenant/name`` from revisions ``current`` to ``new``
    (revision labels) that leaves a merged one."""
    left = {f"{tenant}/{name}@{revision}" for revision in set(current) - set(new)}
    refuse_if_merged(engine, left, f"left by alias {tenant}/{name}")
