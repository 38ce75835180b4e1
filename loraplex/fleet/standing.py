"""``FleetStanding``: the pins, warm policies and tenant settings that ``FleetCache`` applied
fleet-wide, kept the same on every replica, whenever it joined or however long it was away.

Each standing pin (one per (revision, tier), as in a replica's cache) is tracked per replica:
a replica may hold it from when a ``Pin`` is sent to it (a replica records the pin before it
loads, so a failed load leaves it pinned) until its ``Unpin`` answered, and has it for sure once
its ``Pin`` answered. After each
board poll every healthy replica is brought to the standing set: the pins it is missing (a
replacement after a crash, a scale-up, a replica that was out of rotation when the pin went
out) are sent, and so are unpins of the pins it holds that no longer stand (a replica out of
rotation when a release ended kept its pin for good before). Warm policies and tenant
settings are replayed whole to a replica that has not acknowledged the latest of them.

A replayed call that fails (for one, the ingress's request router may not know a new replica
yet when the board already shows it: the call is then refused by another replica and never
reaches it) is tried again ``RETRY_S`` later, doubling up to ``MAX_RETRY_S`` while it keeps
failing (a load that cannot succeed), and logged once per replica until a replay succeeds:
at INFO when the request router refused it (``ReplicaLeftError``: a replica it does not offer
yet, or one it dropped, which is out of rotation from then on and not tried again), else WARNING.

A (re)started ingress starts from ``standing_restore.Restored`` (the registry's tenant settings,
warm policies, release pins and operator pins) and, at its first poll with a healthy replica,
adopts the pins every healthy replica reports that a release needing work names; each replica's
share starts as what it reports holding. Nothing is sent before that poll: a pin that stands
would look lifted.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.engine.tenant_shares import TenantSettings
from loraplex.engine.transport.messages import CacheCommand, Pin, SetWarm, Unpin, UpdateTenants
from loraplex.fleet.board import BoardEntry
from loraplex.fleet.link import FleetLink
from loraplex.fleet.standing_restore import PinKey, Restored, adopted_pins, reported_pins
from loraplex.fleet.wire import ReplicaLeftError
from loraplex.residency.ledger import Tier

_log = logging.getLogger(__name__)
RETRY_S = 2.0  # a replica whose replay failed is tried again this much later (then doubled)
MAX_RETRY_S = 60.0
AdoptedListener = Callable[[set[PinKey]], None]


class FleetStanding:
    """The fleet's standing cache state and each replica's share of it (see the module
    docstring). Every method is thread-safe; the replays run on the link's loop."""

    def __init__(
        self,
        link: FleetLink,
        restored: Restored | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        restored = restored or Restored()
        self._link = link
        self._clock = clock
        self._lock = threading.Lock()
        self._restored = restored  # what adoption goes by (``standing_restore.adopted_pins``)
        self._pins: set[PinKey] = set(restored.release_pins | restored.operator_pins)  # standing
        self._adopted: set[PinKey] | None = None  # standing at the first poll (None: not yet)
        self._lifted_early: set[PinKey] = set()  # unpinned before that poll: not adopted
        self._on_adopted: list[AdoptedListener] = []
        self._known: set[str] = set()  # replicas whose reported pins were taken as held
        self._held: dict[str, set[PinKey]] = {}  # replica -> pins it may hold (Pin sent)
        self._confirmed: dict[str, set[PinKey]] = {}  # replica -> pins its Pin answered for
        self._pending: dict[str, set[PinKey]] = {}  # replica -> pins with a Pin in flight
        self._lifting: dict[str, set[PinKey]] = {}  # replica -> pins with an Unpin in flight
        self._warm: dict[AdapterKey, WarmPolicy] = dict(restored.warm)  # operators' policies
        self._tenants = None if restored.tenants is None else dict(restored.tenants)  # last sent
        # bumped by each warm policy or tenant change; restored ones are replayed to every one
        self._version = int(bool(self._warm) or self._tenants is not None)
        self._synced: dict[str, int] = {}  # replica -> the version it acknowledged whole
        self._changing: dict[str, int] = {}  # replica -> warm/tenant changes in flight to it
        self._busy: set[str] = set()  # replicas with a replay in flight
        self._retry_at: dict[str, float] = {}  # replica -> no replay before this (clock)
        self._failures: dict[str, int] = {}  # replica -> replays failed in a row
        link.on_entries(self._sync)

    # --- changes (FleetCache's) -------------------------------------------------------------

    def pin(self, key: AdapterKey, tier: Tier) -> dict[str, Future[Any]]:
        """``Pin`` on every healthy replica (each one answering holds it); the futures by id."""
        pin = (key, tier)
        with self._lock:
            self._pins.add(pin)
            self._lifted_early.discard(pin)
            replica_ids = self._link.healthy_ids()
            for replica_id in replica_ids:
                self._held.setdefault(replica_id, set()).add(pin)
                self._pending.setdefault(replica_id, set()).add(pin)
        futures = self._link.call_each(Pin(key, tier), replica_ids)
        for replica_id, future in futures.items():
            future.add_done_callback(self._on_pinned(replica_id, pin))
        return futures

    def unpin(self, key: AdapterKey, tier: Tier) -> dict[str, Future[Any]]:
        """``Unpin`` on every healthy replica; one out of rotation gets it when it is back."""
        with self._lock:
            self._pins.discard((key, tier))
            if self._adopted is None:
                self._lifted_early.add((key, tier))
            replica_ids = self._link.healthy_ids()
            for replica_id in replica_ids:
                self._lifting.setdefault(replica_id, set()).add((key, tier))
        futures = self._link.call_each(Unpin(key, tier), replica_ids)
        for replica_id, future in futures.items():
            future.add_done_callback(self._on_unpinned(replica_id, (key, tier)))
        return futures

    def set_warm(self, key: AdapterKey, warm: WarmPolicy | None) -> dict[str, Future[Any]]:
        with self._lock:
            if warm is None:  # NOTE: an operator's on_demand stays (automatic promotion off)
                self._warm.pop(key, None)
            else:
                self._warm[key] = warm
            version = self._next_version()
        return self._versioned(SetWarm(key, warm), version)

    def update_tenants(self, settings: dict[str, TenantSettings]) -> dict[str, Future[Any]]:
        with self._lock:
            self._tenants = dict(settings)
            version = self._next_version()
        return self._versioned(UpdateTenants(dict(settings)), version)

    def on_adopted(self, listener: AdoptedListener) -> None:
        """Calls ``listener`` with the pins standing once the first poll with a healthy replica
        adopted the replicas' (at once when it has)."""
        with self._lock:
            adopted = self._adopted
            if adopted is None:
                self._on_adopted.append(listener)
                return
        listener(set(adopted))

    # --- internals -----------------------------------------------------------------------

    def _adopt(self, entries: list[BoardEntry]) -> bool:
        """At the first poll with a healthy replica, the pins every healthy one holds stand too
        (called under ``_lock``); whether they were adopted (now or before)."""
        if self._adopted is not None:
            return True
        common = adopted_pins(entries, self._restored)
        if common is None:
            return False
        self._pins |= common - self._lifted_early
        self._adopted = set(self._pins)
        self._lifted_early.clear()
        return True

    def _take_reported(self, entries: list[BoardEntry]) -> None:
        """A replica first seen may hold what it reports (called under ``_lock``): a pin that
        no longer stands is lifted there whichever ingress sent it. NOTE: held, not confirmed:
        a replica records a pin before its load, so one that stands is sent again (at once
        when its copy is there) and a load that failed is retried."""
        for e in entries:
            if e.replica_id not in self._known:
                self._known.add(e.replica_id)
                self._held.setdefault(e.replica_id, set()).update(reported_pins(e))

    def _next_version(self) -> int:
        """Called under ``_lock``: a replica that had the whole state is one change behind."""
        self._version += 1
        return self._version

    def _versioned(self, command: CacheCommand, version: int) -> dict[str, Future[Any]]:
        """``command`` (the change to ``version``) on every healthy replica: one that had the
        version before it and answers has the whole state again; any other gets a replay."""
        with self._lock:
            replica_ids = self._link.healthy_ids()
            for replica_id in replica_ids:  # no whole replay meanwhile: it would repeat this
                self._changing[replica_id] = self._changing.get(replica_id, 0) + 1
        futures = self._link.call_each(command, replica_ids)

        def on_done(replica_id: str) -> Callable[[Future[Any]], None]:
            def done(future: Future[Any]) -> None:
                with self._lock:
                    left = self._changing.get(replica_id, 1) - 1
                    if left:
                        self._changing[replica_id] = left
                    else:
                        self._changing.pop(replica_id, None)
                    if not _failed(future) and self._synced.get(replica_id) == version - 1:
                        self._synced[replica_id] = version

            return done

        for replica_id, future in futures.items():
            future.add_done_callback(on_done(replica_id))
        return futures

    def _on_pinned(self, replica_id: str, pin: PinKey) -> Callable[[Future[Any]], None]:
        def done(future: Future[Any]) -> None:
            with self._lock:
                self._pinned(replica_id, pin, ok=not _failed(future))

        return done

    def _on_unpinned(self, replica_id: str, pin: PinKey) -> Callable[[Future[Any]], None]:
        def done(future: Future[Any]) -> None:
            with self._lock:
                self._unpinned(replica_id, pin, ok=not _failed(future))

        return done

    def _pinned(self, replica_id: str, pin: PinKey, *, ok: bool) -> None:
        """A Pin to ``replica_id`` answered (called under ``_lock``). One that answered is held
        even if the pin was lifted meanwhile: its unpin may have run first there, so the next
        sync unpins it again (unpinning is idempotent)."""
        self._pending.get(replica_id, set()).discard(pin)
        if ok:
            self._held.setdefault(replica_id, set()).add(pin)
            self._confirmed.setdefault(replica_id, set()).add(pin)

    def _unpinned(self, replica_id: str, pin: PinKey, *, ok: bool) -> None:
        """An Unpin to ``replica_id`` answered (called under ``_lock``)."""
        self._lifting.get(replica_id, set()).discard(pin)
        if ok:
            self._held.get(replica_id, set()).discard(pin)
            self._confirmed.get(replica_id, set()).discard(pin)

    def _sync(self, entries: list[BoardEntry]) -> None:
        """Brings every healthy replica to the standing state (runs on the link's thread after
        each board poll; the calls run on its loop)."""
        now = self._clock()
        on_board = {e.replica_id for e in entries}
        with self._lock:
            if not self._adopt(entries):
                return  # nothing is sent before the replicas' pins are known
            listeners, self._on_adopted = self._on_adopted, []
            # a replica that left the board is forgotten (one that comes back has a new id)
            self._known &= on_board
            pins = (self._held, self._confirmed, self._pending, self._lifting)
            for book in (*pins, self._synced, self._changing, self._retry_at, self._failures):
                _keep_only(book, on_board)
            self._take_reported(entries)
            plans = {
                e.replica_id: self._plan(e.replica_id)
                for e in entries
                if e.healthy
                and e.replica_id not in self._busy
                and now >= self._retry_at.get(e.replica_id, 0.0)
            }
            for replica_id, (commands, version) in list(plans.items()):
                if not commands:  # nothing to send: it has the whole state (when known)
                    if version is not None:
                        self._synced[replica_id] = version
                    del plans[replica_id]
            self._busy.update(plans)
            adopted = set(self._adopted or ())
        for listener in listeners:
            listener(adopted)
        for replica_id, (commands, version) in plans.items():
            self._replay(replica_id, commands, version)

    def _plan(self, replica_id: str) -> tuple[list[CacheCommand], int | None]:
        """What ``replica_id`` misses of the standing state, and the version it has once that
        answers (None: a warm or tenant change is in flight to it, so it is not known yet);
        called under ``_lock``."""
        commands: list[CacheCommand] = []
        version: int | None = self._version
        if self._synced.get(replica_id) != self._version:
            if replica_id in self._changing:
                version = None
            else:
                if self._tenants is not None:
                    commands.append(UpdateTenants(dict(self._tenants)))
                commands += [SetWarm(key, warm) for key, warm in self._warm.items()]
        held = self._held.setdefault(replica_id, set())
        lifting = self._lifting.setdefault(replica_id, set())
        lifted = sorted(held - self._pins - lifting, key=pin_order)
        lifting.update(lifted)
        commands += [Unpin(key, tier) for key, tier in lifted]
        pending = self._pending.setdefault(replica_id, set())
        missing = sorted(
            self._pins - self._confirmed.get(replica_id, set()) - pending, key=pin_order
        )
        held.update(missing)  # sent below: the replica may hold them from now on
        pending.update(missing)
        commands += [Pin(key, tier) for key, tier in missing]
        return commands, version

    def _replay(self, replica_id: str, commands: list[CacheCommand], version: int | None) -> None:
        futures = [self._link.call(replica_id, command) for command in commands]
        remaining = [len(futures)]
        failures: list[str] = []
        refused = [True]  # every failure was the request router's refusal (ReplicaLeftError)

        def done(command: CacheCommand, future: Future[Any]) -> None:
            with self._lock:
                failed = _failed(future)
                if failed:
                    failures.append(f"{command}: {_error_text(future)}")
                    refused[0] = refused[0] and _refused(future)
                if isinstance(command, Pin):
                    self._pinned(replica_id, (command.key, command.tier), ok=not failed)
                elif isinstance(command, Unpin):
                    self._unpinned(replica_id, (command.key, command.tier), ok=not failed)
                remaining[0] -= 1
                if remaining[0]:
                    return
                self._finish(replica_id, version, failures, refused=refused[0])

        for command, future in zip(commands, futures, strict=True):
            future.add_done_callback(functools.partial(done, command))

    def _finish(
        self, replica_id: str, version: int | None, failures: list[str], *, refused: bool
    ) -> None:
        """A replica's replay ended (called under ``_lock``); ``refused``: each failure was
        the request router's refusal (``ReplicaLeftError``)."""
        self._busy.discard(replica_id)
        if not failures:
            if version is not None and self._synced.get(replica_id, -1) < version:
                self._synced[replica_id] = version
            if self._failures.pop(replica_id, 0):
                _log.info("fleet: replica %s has the standing cache state now", replica_id)
            return
        failed = self._failures[replica_id] = self._failures.get(replica_id, 0) + 1
        self._retry_at[replica_id] = self._clock() + min(RETRY_S * 2 ** (failed - 1), MAX_RETRY_S)
        if failed > 1:
            return
        if not refused:
            _log.warning(
                "fleet: replaying the standing cache state on replica %s failed (tried again "
                "from %g s later): %s",
                replica_id,
                RETRY_S,
                "; ".join(failures),
            )
        elif self._link.has_left(replica_id):
            # NOTE: out of rotation now (``left_replicas``): no replay is planned for it again
            _log.info(
                "fleet: replica %s left Ray Serve's request router (it died or is stopping) "
                "before the standing cache state reached it; nothing more is sent to it",
                replica_id,
            )
        else:
            _log.info(
                "fleet: replica %s is on the board but not yet in the ingress's request router "
                "(it has just started); the standing cache state is sent again %g s later",
                replica_id,
                RETRY_S,
            )


def pin_order(pin: PinKey) -> tuple[str, int]:
    """Pins sorted by revision, then tier (replays and reports list them so)."""
    return str(pin[0]), pin[1].value


def _keep_only(book: dict[str, Any], replica_ids: set[str]) -> None:
    for gone in set(book) - replica_ids:
        del book[gone]


def _failed(future: Future[Any]) -> bool:
    return future.cancelled() or future.exception() is not None


def _refused(future: Future[Any]) -> bool:
    return not future.cancelled() and isinstance(future.exception(), ReplicaLeftError)


def _error_text(future: Future[Any]) -> str:
    if future.cancelled():
        return "cancelled"
    error = future.exception()
    return f"{type(error).__name__}: {error}"
