"""Settings that must outlive an engine process: pins, warm policies, merge holds, a dedication.

They live in the child (its adapter cache, its ``MergeHolds``), so a restarted child would start
without them: a release's held stable revision (kept resident for instant rollback) or an
operator's pin would silently stop holding, and a revision an admin action holds against merging
(``server/merge_guard.py``) could be merged by the new child while the registry change that takes
it away is under way. The parent records every accepted ``Pin`` / ``Unpin`` / ``SetWarm`` /
``HoldMerges`` / ``Dedicate`` here and replays the standing ones into each new child before any
request reaches it.

A release of holds and a withdrawn dedication count from the moment they are asked, whether or
not the child answers: the guard releases in a ``finally`` and nobody retries it, so a release
that failed because the child had just died must not leave the hold to be replayed forever (the
dead child's holds died with it). A hold, a pin or a dedication counts once the child accepted
it.
"""

from __future__ import annotations

import threading
from collections import Counter

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.engine.transport.messages import (
    CacheCommand,
    Dedicate,
    HoldMerges,
    Pin,
    SetWarm,
    Unpin,
)
from loraplex.residency.ledger import Tier


class StandingSettings:
    """The pins, operator warm policies, merge holds and dedication in force, as the child was
    told them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pins: dict[AdapterKey, set[Tier]] = {}
        self._warm: dict[AdapterKey, WarmPolicy] = {}
        self._held: Counter[str] = Counter()  # ref -> holds on it (they nest, as in MergeHolds)
        self._dedicated: str | None = None  # the ref a fleet dedicated the engine to

    def withdraw(self, command: CacheCommand) -> None:
        """Notes a release of holds or a withdrawn dedication before it is sent: it counts
        whether or not the child answers (the module docstring). Other commands: nothing."""
        with self._lock:
            if isinstance(command, HoldMerges) and not command.hold:
                self._held.subtract(command.refs)
                self._held = +self._held  # NOTE: unary + drops the counts at or below zero
            elif isinstance(command, Dedicate) and command.ref is None:
                self._dedicated = None

    def record(self, command: CacheCommand) -> None:
        """Notes ``command``, which the child accepted, if it sets a standing setting (others
        are ignored: a prefetch or an eviction holds nothing across a restart, and withdrawals
        were noted by ``withdraw``)."""
        with self._lock:
            if isinstance(command, Pin):
                self._pins.setdefault(command.key, set()).add(command.tier)
            elif isinstance(command, Unpin):
                self._unpin(command)
            elif isinstance(command, SetWarm):
                if command.warm is None:
                    self._warm.pop(command.key, None)
                else:
                    self._warm[command.key] = command.warm
            elif isinstance(command, HoldMerges) and command.hold:
                self._held.update(command.refs)
            elif isinstance(command, Dedicate) and command.ref is not None:
                self._dedicated = command.ref

    def _unpin(self, command: Unpin) -> None:
        tiers = self._pins.get(command.key)
        if tiers is not None:
            tiers.discard(command.tier)
            if not tiers:
                del self._pins[command.key]

    def replay(self) -> list[CacheCommand]:
        """The commands that give a fresh child the same settings: warm policies, pins, then
        one ``HoldMerges`` per hold (nested holds nest again) and the dedication."""
        with self._lock:
            warm: list[CacheCommand] = [SetWarm(k, w) for k, w in self._warm.items()]
            pins: list[CacheCommand] = [
                Pin(k, t) for k, tiers in self._pins.items() for t in sorted(tiers)
            ]
            holds: list[CacheCommand] = [
                HoldMerges(frozenset({ref}), hold=True)
                for ref, count in sorted(self._held.items())
                for _ in range(count)
            ]
            dedicated = self._dedicated
        dedication: list[CacheCommand] = [] if dedicated is None else [Dedicate(dedicated)]
        return warm + pins + holds + dedication

    def pins(self) -> dict[AdapterKey, frozenset[Tier]]:
        with self._lock:
            return {k: frozenset(t) for k, t in self._pins.items()}

    def holds(self) -> dict[str, int]:
        """Ref -> holds in force on it."""
        with self._lock:
            return dict(self._held)
