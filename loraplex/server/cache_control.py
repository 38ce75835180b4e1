"""``CacheControl``: what the HTTP layer asks of the adapter cache."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Protocol

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.residency.cache import CacheSummary, CopyHolds, ResidencySnapshot, Unpinned
from loraplex.residency.ledger import Tier


class CacheControl(Protocol):
    """``TieredAdapterCache`` itself when the engine runs in this process,
    ``engine.transport.remote_cache.RemoteCache`` when it runs in a child."""

    def snapshot(self) -> ResidencySnapshot:
        """Every copy in every tier (the admin view; costs what is cached)."""
        ...

    def summary(self) -> CacheSummary:
        """The counters and per-tier totals (/metrics; costs the same however much is cached)."""
        ...

    def is_resident(self, key: AdapterKey, tier: Tier) -> bool: ...

    def pin(self, key: AdapterKey, tier: Tier) -> Future[None]: ...

    def prefetch(self, key: AdapterKey, tier: Tier) -> Future[None]: ...

    def unpin(self, key: AdapterKey, tier: Tier) -> Unpinned:
        """Lifts the pin; the answer says whether there was one and what pins the copy still."""
        ...

    def evict(self, key: AdapterKey, tier: Tier) -> bool: ...

    def holds(self, key: AdapterKey, tier: Tier) -> CopyHolds:
        """What keeps the copy from eviction (a kept ``evict`` says which)."""
        ...

    def set_warm_policy(self, key: AdapterKey, warm: WarmPolicy | None) -> None: ...

    def drop_auto_warm(self, key: AdapterKey) -> None:
        """The revision was deprecated: its automatic warm policy and request rates go."""
        ...
