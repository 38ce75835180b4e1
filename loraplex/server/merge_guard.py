"""Refuses admin actions that would take a merged revision out from under the engine.

While a revision is merged into the engine's base weights (``mode`` ``auto`` or
``merged:<ref>``, docs/modes.md), deprecating it, or moving its alias off it (a new target set
or a rollback), is refused with a 409 naming it (``MergedRevisionError``): it must be unmerged
first. The engine says what is merged in its published report (``EngineLoad.mode``; behind a
fleet ingress every replica's, ``EngineLoad.replicas_merged``), so the check never waits on it.
An engine that is down has nothing merged: a restarted engine starts unmerged. ``guarded``
also holds the revisions against merging while the registry changes (``engine/merge_holds.py``),
which closes the window between the check and the change; an engine child restarted meanwhile
gets the hold again (``engine/standing.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from loraplex.engine.merge_holds import MergeHoldControl
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


def left_by(tenant: str, name: str, current: Iterable[str], new: Iterable[str]) -> frozenset[str]:
    """Refs an alias change of ``tenant/name`` from revisions ``current`` to ``new`` (revision
    labels) leaves."""
    return frozenset(f"{tenant}/{name}@{revision}" for revision in set(current) - set(new))


@contextmanager
def guarded(
    engine: EngineClient, holds: MergeHoldControl | None, revisions: Iterable[str], action: str
) -> Iterator[None]:
    """Runs the body (the registry change that takes ``revisions`` away) only when none of them
    is merged, and holds them against merging until it is done, so a merge cannot land between
    the check and the change (``engine/merge_holds.py``). ``holds`` None: the published report
    alone (an engine that never merges); an engine that is down takes no hold (it restarts
    unmerged)."""
    refs = frozenset(revisions)
    held = holds is not None and bool(refs)
    merged: frozenset[str] = frozenset()
    if held and holds is not None:
        try:
            merged = holds.hold(refs)
        except EngineUnavailableError:
            held = False
    try:
        refused = sorted(merged | (merged_revisions(engine) & refs))
        if refused:
            raise MergedRevisionError(refused[0], action)
        yield
    finally:
        if held and holds is not None:
            holds.release(refs)
