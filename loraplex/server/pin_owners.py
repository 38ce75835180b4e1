"""``OwnedPins``: pins with owners, so a release and an operator never lift each other's pin.

The adapter cache keeps one pin per (revision, tier). A release holds its stable revision (and
prewarms its candidate) with pins, and an operator may pin the same revision through
``/admin/residency/pin``; with one shared pin, the release's ``unhold`` after its rollback
window would silently lift the operator's pin (or the operator's unpin the release's hold).
Every pin of this server goes through ``OwnedPins``: the cache is pinned while any owner holds
the (revision, tier) and unpinned when the last one lets go.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import Future

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.residency.cache import CacheSummary, ResidencySnapshot
from loraplex.residency.ledger import Tier
from loraplex.server.cache_control import CacheControl

OPERATOR = "operator"  # /admin/residency/pin
RELEASE = "release"  # the release controller's prewarm and hold pins


class OwnedPins:
    """A ``CacheControl`` whose pins are held per owner (see the module docstring)."""

    def __init__(self, cache: CacheControl) -> None:
        self._cache = cache
        self._lock = threading.Lock()  # NOTE: held across the cache call, so pins stay ordered
        self._owners: dict[tuple[AdapterKey, Tier], set[str]] = {}

    def pin(self, key: AdapterKey, tier: Tier, owner: str = OPERATOR) -> Future[None]:
        """Pins ``key`` in ``tier`` for ``owner`` (the cache loads it if needed); pinning again
        for the same owner changes nothing but returns the load's future."""
        with self._lock:
            future = self._cache.pin(key, tier)
            self._owners.setdefault((key, tier), set()).add(owner)
            return future

    def unpin(self, key: AdapterKey, tier: Tier, owner: str = OPERATOR) -> None:
        """Lets go of ``owner``'s pin; the cache unpins once no owner is left."""
        with self._lock:
            owners = self._owners.get((key, tier))
            if owners is not None:
                owners.discard(owner)
                if owners:
                    return  # someone else still holds it
                del self._owners[(key, tier)]
            self._cache.unpin(key, tier)

    def adopt(self, owners: Mapping[tuple[AdapterKey, Tier], str]) -> None:
        """Records pins the cache holds already (a restarted fleet ingress adopts the replicas'
        pins) under their owners, so one owner's unpin leaves another's pin; the cache is not
        called."""
        with self._lock:
            for pin, owner in owners.items():
                self._owners.setdefault(pin, set()).add(owner)

    def owners(self, key: AdapterKey, tier: Tier) -> frozenset[str]:
        with self._lock:
            return frozenset(self._owners.get((key, tier), ()))

    # --- the rest of CacheControl, unchanged ----------------------------------------------------

    def snapshot(self) -> ResidencySnapshot:
        return self._cache.snapshot()

    def summary(self) -> CacheSummary:
        return self._cache.summary()

    def is_resident(self, key: AdapterKey, tier: Tier) -> bool:
        return self._cache.is_resident(key, tier)

    def prefetch(self, key: AdapterKey, tier: Tier) -> Future[None]:
        return self._cache.prefetch(key, tier)

    def evict(self, key: AdapterKey, tier: Tier) -> bool:
        return self._cache.evict(key, tier)

    def set_warm_policy(self, key: AdapterKey, warm: WarmPolicy | None) -> None:
        self._cache.set_warm_policy(key, warm)
