"""What the server process knows of its engine child without asking it: the state the child
publishes (``messages.StatePublish``), kept up to date from what changed.

``load_snapshot``, ``RemoteCache.is_resident`` and ``RemoteCache.summary`` (hence /metrics) read
it; none of them is a round trip into the child, and none costs more with more cached copies:
residency arrives as deltas and the adapters in GPU slots (at most ``max_loras``) are kept apart.
"""

from __future__ import annotations

import threading

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.protocol import EngineLoad
from loraplex.engine.sched.stats import EMPTY_VIEW, load_of
from loraplex.engine.transport.messages import StatePublish
from loraplex.residency.cache import CacheSummary
from loraplex.residency.ledger import Tier


class PublishedState:
    """The latest published state of one engine child (empty until it publishes; thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue = EMPTY_VIEW
        self._tiers: dict[AdapterKey, tuple[Tier, ...]] = {}  # ready tiers per cached adapter
        self._in_slots: dict[AdapterKey, None] = {}  # adapters ready in L0, in arrival order
        self._summary: CacheSummary | None = None  # None: no cache summary published yet
        self.num_updates = 0  # publishes applied (the child sends one only when state changed)

    def apply(self, state: StatePublish) -> None:
        with self._lock:
            self.num_updates += 1
            if state.queue is not None:
                self._queue = state.queue
            if state.summary is not None:
                self._summary = state.summary
            if state.residency is None:
                return
            if state.residency.full:
                self._tiers.clear()
                self._in_slots.clear()
            for key, tiers in state.residency.tiers.items():
                self._set_tiers(key, tiers)

    def _set_tiers(self, key: AdapterKey, tiers: tuple[Tier, ...]) -> None:
        if tiers:
            self._tiers[key] = tiers
        else:  # no ready copy left
            self._tiers.pop(key, None)
        if Tier.L0 in tiers:
            self._in_slots[key] = None
        else:
            self._in_slots.pop(key, None)

    def clear(self) -> None:
        """The child is gone: nothing is resident, queued or counted any more."""
        with self._lock:
            self._queue = EMPTY_VIEW
            self._tiers.clear()
            self._in_slots.clear()
            self._summary = None

    def is_resident(self, key: AdapterKey, tier: Tier) -> bool:
        with self._lock:
            return tier in self._tiers.get(key, ())

    def summary(self) -> CacheSummary | None:
        with self._lock:
            return self._summary

    def load(self, max_loras: int) -> EngineLoad:
        with self._lock:
            queue = self._queue
            running = tuple(self._in_slots)
        return load_of(queue, running, max_loras)
