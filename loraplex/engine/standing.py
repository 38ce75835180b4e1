"""Operator cache settings that must outlive an engine process: pins and warm policies.

They live in the child's adapter cache, so a restarted child would start without them: a
release's held stable revision (kept resident for instant rollback) or an operator's pin would
silently stop holding. The parent records every accepted ``Pin`` / ``Unpin`` / ``SetWarm`` here
and replays the standing ones into each new child before any request reaches it.
"""

from __future__ import annotations

import threading

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.engine.transport.messages import CacheCommand, Pin, SetWarm, Unpin
from loraplex.residency.ledger import Tier


class StandingSettings:
    """The pins and operator warm policies in force, as the child was told them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pins: dict[AdapterKey, set[Tier]] = {}
        self._warm: dict[AdapterKey, WarmPolicy] = {}

    def record(self, command: CacheCommand) -> None:
        """Notes ``command`` if it changes a standing setting (others are ignored: they hold
        nothing across a restart, e.g. a prefetch or an eviction)."""
        with self._lock:
            if isinstance(command, Pin):
                self._pins.setdefault(command.key, set()).add(command.tier)
            elif isinstance(command, Unpin):
                tiers = self._pins.get(command.key)
                if tiers is not None:
                    tiers.discard(command.tier)
                    if not tiers:
                        del self._pins[command.key]
            elif isinstance(command, SetWarm):
                if command.warm is None:
                    self._warm.pop(command.key, None)
                else:
                    self._warm[command.key] = command.warm

    def replay(self) -> list[CacheCommand]:
        """The commands that give a fresh child the same settings: warm policies, then pins."""
        with self._lock:
            warm: list[CacheCommand] = [SetWarm(k, w) for k, w in self._warm.items()]
            pins: list[CacheCommand] = [
                Pin(k, t) for k, tiers in self._pins.items() for t in sorted(tiers)
            ]
        return warm + pins

    def pins(self) -> dict[AdapterKey, frozenset[Tier]]:
        with self._lock:
            return {k: frozenset(t) for k, t in self._pins.items()}
