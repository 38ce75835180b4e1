"""``RemoteCache``: the cache-control surface of an engine process's adapter cache.

It is handed the two calls it makes (``EngineProcess.call`` and ``call_future``), not the
process: the process builds it, so naming the process here would make the two files import each
other."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.engine.transport.messages import (
    CacheCommand,
    DropAutoWarm,
    Evict,
    HoldMerges,
    Holds,
    Pin,
    Prefetch,
    SetWarm,
    Snapshot,
    Unpin,
)
from loraplex.engine.transport.process_state import PublishedState
from loraplex.errors import EngineUnavailableError
from loraplex.residency.cache import CacheSummary, CopyHolds, ResidencySnapshot, Unpinned
from loraplex.residency.ledger import Tier


class RemoteCache:
    """The cache-control surface of the child's adapter cache (``server.deps.CacheControl``).

    ``is_resident`` and ``summary`` answer from the latest published state (at most
    ``state_interval_s`` old; nothing is resident while the engine is down); the other methods
    are calls into the child (``EngineUnavailableError`` while it is down). It holds the
    ``EngineProcess``'s calls, not a child's, so after a restart it answers from the new child."""

    def __init__(
        self,
        call: Callable[[CacheCommand], Any],
        call_future: Callable[[CacheCommand], Future[None]],
        state: PublishedState,
    ) -> None:
        self._call = call  # runs a command in the child, returns its result
        self._call_future = call_future  # a loading command: completes when its load does
        self._state = state

    def snapshot(self) -> ResidencySnapshot:
        result: ResidencySnapshot = self._call(Snapshot())
        return result

    def summary(self) -> CacheSummary:
        """The published counters; EngineUnavailableError before the child published any."""
        summary = self._state.summary()
        if summary is None:
            raise EngineUnavailableError("the engine process has published no cache state")
        return summary

    def is_resident(self, key: AdapterKey, tier: Tier) -> bool:
        return self._state.is_resident(key, tier)

    def pin(self, key: AdapterKey, tier: Tier) -> Future[None]:
        return self._call_future(Pin(key, tier))

    def prefetch(self, key: AdapterKey, tier: Tier) -> Future[None]:
        return self._call_future(Prefetch(key, tier))

    def unpin(self, key: AdapterKey, tier: Tier) -> Unpinned:
        unpinned: Unpinned = self._call(Unpin(key, tier))
        return unpinned

    def evict(self, key: AdapterKey, tier: Tier) -> bool:
        evicted: bool = self._call(Evict(key, tier))
        return evicted

    def holds(self, key: AdapterKey, tier: Tier) -> CopyHolds:
        holds: CopyHolds = self._call(Holds(key, tier))
        return holds

    def set_warm_policy(self, key: AdapterKey, warm: WarmPolicy | None) -> None:
        self._call(SetWarm(key, warm))

    def drop_auto_warm(self, key: AdapterKey) -> None:
        self._call(DropAutoWarm(key))


class RemoteMergeHolds:
    """The merge holds of an engine process's child (``engine.merge_holds.MergeHoldControl``):
    each call runs in the child (``EngineUnavailableError`` while it is down)."""

    def __init__(self, call: Callable[[CacheCommand], Any]) -> None:
        self._call = call  # runs a command in the child, returns its result

    def hold(self, refs: frozenset[str]) -> frozenset[str]:
        merged: frozenset[str] = self._call(HoldMerges(refs, hold=True))
        return merged

    def release(self, refs: frozenset[str]) -> None:
        self._call(HoldMerges(refs, hold=False))
