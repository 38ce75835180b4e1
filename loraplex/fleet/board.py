"""The fleet board: every engine replica's latest status, as the ingress and ``fleet status``
see them.

Each engine replica pushes its ``EngineReplica.status()`` every ``PUSH_INTERVAL_S``; ``Board``
keeps the latest per replica with the time it arrived (the board's clock, so replica clocks do
not matter). A replica whose last push is older than the fleet's ``stale_after_s`` (default
``STALE_AFTER_S``) is out of rotation for the ingress (``healthy`` False, ``down_reason`` "stale
report"); one silent for ``FORGET_AFTER_S`` is dropped. In a fleet it lives in a plain Ray actor
(``board_store.BoardStore``) owned by the ``Board`` deployment's one replica
(``deployments.FleetBoardImpl``), which answers reads of it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loraplex.errors import quoted
from loraplex.router.reports import MAX_REPLICA_ID_CHARS

PUSH_INTERVAL_S = 0.5  # how often an engine replica pushes its status
STALE_AFTER_S = 3.0  # a replica silent this long is out of rotation
FORGET_AFTER_S = 60.0  # a replica silent this long is dropped from the board
MAX_REPLICAS = 4096  # entries the board keeps (a bound on what replicas can make it hold)
# a status's explicit pins, [(AdapterKey, Tier)]: the ``Pin``s an ingress sent it and no
# ``Unpin`` lifted (a restarted ingress adopts them: ``fleet/standing_restore.py``)
PINS_KEY = "pins"


@dataclass(frozen=True)
class BoardEntry:
    """One replica's latest status and how old it is."""

    replica_id: str
    status: dict[str, Any]  # ``EngineReplica.status()``
    age_s: float  # seconds since it arrived
    stale_after_s: float = STALE_AFTER_S  # older than this: stale, out of rotation
    # dropped by the request router of the process reading the board (``FleetLink``: it died
    # or is stopping), out of rotation although its last report may still be fresh
    left: bool = False

    @property
    def fresh(self) -> bool:
        return self.age_s <= self.stale_after_s

    @property
    def healthy(self) -> bool:
        """Reported recently, took requests then, and the request router still offers it."""
        return self.fresh and not self.left and bool(self.status.get("healthy"))

    @property
    def down_reason(self) -> str | None:
        """Why the replica is out of rotation (a stale report, or what its engine said); None
        while it is healthy."""
        if self.left:
            return (
                "left Ray Serve's request router: it died or is stopping (Ray Serve replaces "
                f"one that died); dropped from the board after {FORGET_AFTER_S:g} s of silence"
            )
        if not self.fresh:
            # NOTE: a replica that died reads the same until it is forgotten, beside the one Ray
            # Serve started in its place; "hung or unreachable" alone sent operators after it
            return (
                f"stale report: none for {self.age_s:.1f} s (bound {self.stale_after_s:g} s); "
                "the replica is hung, unreachable or gone (Ray Serve replaces one that died); "
                f"dropped from the board after {FORGET_AFTER_S:g} s of silence"
            )
        if self.status.get("healthy"):
            return None
        reason = self.status.get("down_reason")
        return str(reason) if reason else "its engine is down"


class Board:
    """Latest status per replica (thread-safe)."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, stale_after_s: float = STALE_AFTER_S
    ) -> None:
        self._clock = clock
        self._stale_after_s = stale_after_s
        self._lock = threading.Lock()
        self._latest: dict[str, tuple[float, dict[str, Any]]] = {}

    def put(self, status: dict[str, Any]) -> None:
        replica_id = status.get("replica_id")
        if not isinstance(replica_id, str) or not 0 < len(replica_id) <= MAX_REPLICA_ID_CHARS:
            raise ValueError(
                f"status replica_id {quoted(replica_id)} is invalid; expected a string of "
                f"1..{MAX_REPLICA_ID_CHARS} characters"
            )
        now_s = self._clock()
        with self._lock:
            self._forget_silent(now_s)
            if replica_id not in self._latest and len(self._latest) >= MAX_REPLICAS:
                raise ValueError(f"the board holds {MAX_REPLICAS} replicas; expected fewer")
            self._latest[replica_id] = (now_s, status)

    def remove(self, replica_id: str) -> None:
        """Drops a replica at once (it is shutting down)."""
        with self._lock:
            self._latest.pop(replica_id, None)

    def entries(self) -> list[BoardEntry]:
        """Every replica heard from within ``FORGET_AFTER_S``, by id."""
        now_s = self._clock()
        with self._lock:
            self._forget_silent(now_s)
            return [
                BoardEntry(replica_id, status, now_s - at_s, self._stale_after_s)
                for replica_id, (at_s, status) in sorted(self._latest.items())
            ]

    def _forget_silent(self, now_s: float) -> None:
        for replica_id, (at_s, _) in list(self._latest.items()):
            if now_s - at_s > FORGET_AFTER_S:
                del self._latest[replica_id]
