"""``RemoteCache``: the cache-control surface of an engine process's adapter cache."""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.residency.cache.view import ResidencySnapshot
from loraplex.residency.ledger import Tier

if TYPE_CHECKING:
    from loraplex.engine.process import EngineProcess


class RemoteCache:
    """The cache-control surface of the child's adapter cache (``server.deps.CacheControl``).

    ``is_resident`` answers from the latest published state (at most ``state_interval_s`` old;
    nothing is resident while the engine is down); the other methods are calls into the child
    (``EngineUnavailableError`` while it is down). It holds the ``EngineProcess``, not a child,
    so after a restart it answers from the new child."""

    def __init__(self, engine: EngineProcess) -> None:
        self._engine = engine

    def snapshot(self) -> ResidencySnapshot:
        result: ResidencySnapshot = self._engine.call("snapshot")
        return result

    def is_resident(self, key: AdapterKey, tier: Tier) -> bool:
        return tier in self._engine.residency.get(key, ())

    def pin(self, key: AdapterKey, tier: Tier) -> Future[None]:
        return self._engine.call_future("pin", key, tier)

    def prefetch(self, key: AdapterKey, tier: Tier) -> Future[None]:
        return self._engine.call_future("prefetch", key, tier)

    def unpin(self, key: AdapterKey, tier: Tier) -> None:
        self._engine.call("unpin", key, tier)

    def evict(self, key: AdapterKey, tier: Tier) -> bool:
        evicted: bool = self._engine.call("evict", key, tier)
        return evicted

    def set_warm_policy(self, key: AdapterKey, warm: WarmPolicy | None) -> None:
        self._engine.call("set_warm_policy", key, warm)
