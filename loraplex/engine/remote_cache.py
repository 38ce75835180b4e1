"""``RemoteCache``: the cache-control surface of an engine process's adapter cache."""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.engine.messages import Evict, Pin, Prefetch, SetWarm, Snapshot, Unpin
from loraplex.engine.process_state import PublishedState
from loraplex.errors import EngineUnavailableError
from loraplex.residency.cache import CacheSummary, ResidencySnapshot
from loraplex.residency.ledger import Tier

if TYPE_CHECKING:
    from loraplex.engine.process import EngineProcess


class RemoteCache:
    """The cache-control surface of the child's adapter cache (``server.deps.CacheControl``).

    ``is_resident`` and ``summary`` answer from the latest published state (at most
    ``state_interval_s`` old; nothing is resident while the engine is down); the other methods
    are calls into the child (``EngineUnavailableError`` while it is down). It holds the
    ``EngineProcess``, not a child, so after a restart it answers from the new child."""

    def __init__(self, engine: EngineProcess, state: PublishedState) -> None:
        self._engine = engine
        self._state = state

    def snapshot(self) -> ResidencySnapshot:
        result: ResidencySnapshot = self._engine.call(Snapshot())
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
        return self._engine.call_future(Pin(key, tier))

    def prefetch(self, key: AdapterKey, tier: Tier) -> Future[None]:
        return self._engine.call_future(Prefetch(key, tier))

    def unpin(self, key: AdapterKey, tier: Tier) -> None:
        self._engine.call(Unpin(key, tier))

    def evict(self, key: AdapterKey, tier: Tier) -> bool:
        evicted: bool = self._engine.call(Evict(key, tier))
        return evicted

    def set_warm_policy(self, key: AdapterKey, warm: WarmPolicy | None) -> None:
        self._engine.call(SetWarm(key, warm))
