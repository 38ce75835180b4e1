"""``OwnedPins``: pins with owners, so a release and an operator never lift each other's pin.

The adapter cache keeps one pin per (revision, tier). A release holds its stable revision (and
prewarms its candidate) with pins, and an operator may pin the same revision through
``/admin/residency/pin``; with one shared pin, the release's ``unhold`` after its rollback
window would silently lift the operator's pin (or the operator's unpin the release's hold).
Every pin of this server goes through ``OwnedPins``: the cache is pinned while any owner holds
the (revision, tier) and unpinned when the last one lets go.

An operator's pins are also recorded (``PinRecord``: the registry's ``operator_pins``) so they
outlive a server restart: recorded before the cache pins, removed before it unpins, the record
undone when the cache call fails (so the record never holds what the cache refused). The
server's start reads them back (``serve/operator_pins.py``) and hands them to ``adopt``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import replace
from typing import Protocol

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.registry import Registry
from loraplex.residency.cache import CacheSummary, CopyHolds, ResidencySnapshot, Unpinned
from loraplex.residency.ledger import Tier
from loraplex.server.cache_control import CacheControl

_log = logging.getLogger(__name__)
OPERATOR = "operator"  # /admin/residency/pin
RELEASE = "release"  # the release controller's prewarm and hold pins


class PinRecord(Protocol):
    """Where an operator's pins outlive the server (``RegistryPins``; tests: a fake)."""

    def record(self, key: AdapterKey, tier: Tier) -> bool:
        """Records the pin; False when it was recorded already."""
        ...

    def remove(self, key: AdapterKey, tier: Tier) -> bool:
        """Removes the pin; False when none was recorded."""
        ...


class RegistryPins:
    """``PinRecord`` over the registry's ``operator_pins`` (audited as ``actor``)."""

    def __init__(self, registry: Registry, actor: str) -> None:
        self._registry = registry
        self._actor = actor

    def record(self, key: AdapterKey, tier: Tier) -> bool:
        return self._registry.record_operator_pin(key.ref, tier.name, self._actor)

    def remove(self, key: AdapterKey, tier: Tier) -> bool:
        return self._registry.remove_operator_pin(key.ref, tier.name, self._actor)


class OwnedPins:
    """A ``CacheControl`` whose pins are held per owner (see the module docstring);
    ``record``: where an operator's pins are recorded (None: nowhere, they die with the
    server)."""

    def __init__(self, cache: CacheControl, record: PinRecord | None = None) -> None:
        self._cache = cache
        self._record = record
        # NOTE: two locks. ``_lock`` guards the dicts only and is never held across a call out;
        # ``_serial`` holds one (revision, tier)'s own lock across its record write (the
        # registry: a PostgreSQL round trip, or many when it is slow) and its cache call (a pipe
        # or every replica), because they must stay ordered per pin: an unpin that ran between a
        # pin's record and its cache pin would find no owner, unpin nothing, then leave the copy
        # pinned and owned but its record removed (lost at the next restart). One global lock
        # across both stalled every other pin, unpin, ``holds`` (a kept evict's reason, an
        # unload's 409) and the release controller's pins behind one slow database write.
        self._lock = threading.Lock()
        self._owners: dict[tuple[AdapterKey, Tier], set[str]] = {}
        self._pin_locks: dict[tuple[AdapterKey, Tier], tuple[threading.Lock, int]] = {}

    @contextlib.contextmanager
    def _serial(self, key: AdapterKey, tier: Tier) -> Iterator[None]:
        """Holds (key, tier)'s own lock: calls on one pin run one at a time, in the order they
        took it; other pins are not waited for. The lock is dropped when no caller holds or
        waits for it, so the dict stays as small as the calls in flight."""
        pin = (key, tier)
        with self._lock:
            lock, users = self._pin_locks.get(pin, (threading.Lock(), 0))
            self._pin_locks[pin] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._lock:
                users = self._pin_locks[pin][1] - 1
                if users:
                    self._pin_locks[pin] = (lock, users)
                else:
                    del self._pin_locks[pin]

    def pin(self, key: AdapterKey, tier: Tier, owner: str = OPERATOR) -> Future[None]:
        """Pins ``key`` in ``tier`` for ``owner`` (the cache loads it if needed); pinning again
        for the same owner changes nothing but returns the load's future. An operator's pin is
        recorded first (a failed record pins nothing)."""
        with self._serial(key, tier):
            record = self._recorder(owner)
            recorded = record is not None and record.record(key, tier)
            try:
                future = self._cache.pin(key, tier)
            except BaseException:
                if record is not None and recorded:
                    _undo(lambda: record.remove(key, tier))
                raise
            with self._lock:
                self._owners.setdefault((key, tier), set()).add(owner)
            return future

    def unpin(self, key: AdapterKey, tier: Tier, owner: str = OPERATOR) -> Unpinned:
        """Lets go of ``owner``'s pin; the cache unpins once no owner is left. An operator's
        record is removed first (a failed removal unpins nothing). The answer's ``owners`` are
        the others holding the pin still; while there are any the cache is not called, so the
        answer names no warm policy (``holds`` does: a release's unpin needs no such call)."""
        with self._serial(key, tier):
            record = self._recorder(owner)
            removed = record is not None and record.remove(key, tier)
            try:
                return self._unpin(key, tier, owner)
            except BaseException:
                if record is not None and removed:
                    _undo(lambda: record.record(key, tier))
                raise

    def _unpin(self, key: AdapterKey, tier: Tier, owner: str) -> Unpinned:
        """(Under ``_serial``: the owners and the cache call of one pin stay ordered.) The last
        owner is dropped only once the cache has unpinned: a refused unpin leaves the owners
        as they were, as ``unpin`` puts the record back, so the owner's next unpin finds it."""
        pin = (key, tier)
        with self._lock:
            owners = self._owners.get(pin)
            if owners is not None:
                held = owner in owners
                others = frozenset(owners - {owner})
                if others:
                    owners.discard(owner)
        if owners is None:  # no owner known: a pin made around ``OwnedPins``, if any
            return self._cache.unpin(key, tier)
        if others:  # someone else still holds it
            return Unpinned(held, owners=others)
        unpinned = self._cache.unpin(key, tier)  # raises: the owners stay
        with self._lock:
            left = self._owners.get(pin)
            if left is not None:
                left.discard(owner)
                if not left:
                    del self._owners[pin]
        return Unpinned(held or unpinned.lifted, unpinned.warm)

    def _recorder(self, owner: str) -> PinRecord | None:
        return self._record if owner == OPERATOR else None

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

    def holds(self, key: AdapterKey, tier: Tier) -> CopyHolds:
        """The cache's answer with the pin's owners."""
        return replace(self._cache.holds(key, tier), owners=self.owners(key, tier))

    def set_warm_policy(self, key: AdapterKey, warm: WarmPolicy | None) -> None:
        self._cache.set_warm_policy(key, warm)

    def drop_auto_warm(self, key: AdapterKey) -> None:
        self._cache.drop_auto_warm(key)


def _undo(change: Callable[[], bool]) -> None:
    """Puts an operator pin's record back after the cache refused the change; the cache's error
    is the one raised, so an undo that fails too is logged."""
    try:
        change()
    except Exception:
        _log.exception("the record of an operator pin could not be put back")
