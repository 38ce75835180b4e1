"""Holds that close the admin guard's check-then-act window (docs/modes.md).

The admin guard refuses to deprecate a merged revision or move its alias off it. Reading the
engine's published report and then changing the registry leaves a window: an ``auto`` merge
landing between the two would not be seen. So the guard first *holds* the revisions it is about
to take away, and the answer to the hold says, atomically, which of them are merged now; while
held, the engine refuses to merge them (``ModeSwitcher.merge`` asks ``merge_if_free``). Either
the merge landed first (the hold answers it, 409) or it comes after the hold is released, when
the registry has already changed. Holds count, so two admin actions on one revision nest.

The same object carries a fleet's dedication (``dedicate``): the revision the fleet's topology
asked this engine's ``auto`` mode to merge (docs/modes.md, "Topology").

Torch-free: the server names ``MergeHoldControl``; the engine side owns ``MergeHolds``
(``AdapterRuntime.merge_holds``), reached in this process directly, in an engine child through
the ``HoldMerges`` cache command, and on a fleet's replicas through each replica's cache call.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Protocol, TypeVar

T = TypeVar("T")


class MergeHoldControl(Protocol):
    """What the admin guard asks of the engine side (one engine, an engine child, a fleet)."""

    def hold(self, refs: frozenset[str]) -> frozenset[str]:
        """Holds ``refs`` (``tenant/name@revision``) against merging; returns those merged now."""
        ...

    def release(self, refs: frozenset[str]) -> None:
        """Drops one hold on each of ``refs``."""
        ...


class MergeHolds:
    """One engine's holds and the revision merged into its weights, under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: Counter[str] = Counter()  # ref -> holds on it
        self._merged: str | None = None  # the ref in the base weights; None: unmerged
        self._dedicated: str | None = None  # the ref the fleet asked ``auto`` to merge

    def hold(self, refs: frozenset[str]) -> frozenset[str]:
        with self._lock:
            self._held.update(refs)
            return frozenset(ref for ref in refs if ref == self._merged)

    def release(self, refs: frozenset[str]) -> None:
        with self._lock:
            self._held.subtract(refs)
            self._held = +self._held  # NOTE: unary + drops the counts at or below zero

    def is_held(self, ref: str) -> bool:
        with self._lock:
            return self._held[ref] > 0

    def merge_if_free(self, ref: str, merge: Callable[[], T]) -> T | None:
        """``merge()`` unless ``ref`` is held (None then); no hold can be taken while it runs,
        so a hold answers either before the merge began or with the merge done."""
        with self._lock:
            if self._held[ref] > 0:
                return None
            done = merge()
            self._merged = ref
            return done

    def unmerged(self) -> None:
        """The merged revision left the weights."""
        with self._lock:
            self._merged = None

    @property
    def dedicated(self) -> str | None:
        """The revision a fleet dedicated this engine to (``router/topology.py``): ``auto``
        merges it and keeps it merged while set; None: ``auto`` decides alone."""
        with self._lock:
            return self._dedicated

    def dedicate(self, ref: str | None) -> None:
        with self._lock:
            self._dedicated = ref
