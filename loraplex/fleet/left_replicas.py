"""The engine replicas this process's Ray Serve request router dropped (``LEFT_REPLICAS``): the
ingress's view of the board (``FleetLink.entries``) takes them out of rotation at once.

NOTE: Ray Serve drops a dead replica from its request router as soon as it learns of the death
(a call to it failed: ``on_replica_actor_died``; its controller's update: ``update_replicas``),
but the board shows the replica healthy until its reports are ``stale_after_s`` old (3 s by
default). Every reader of the board counted it for those seconds: the load sum, a request's
arrival tier, a fleet-wide change, a release's probe, the standing state's replay
(docs/benchmarks/fleetdeath.md). A Ray replica id is never reused (a replacement has a new
one), so a replica dropped stays out: nothing marks it back.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable

_log = logging.getLogger(__name__)
MAX_REMEMBERED = 4096  # replica ids kept (the board's bound, ``board.MAX_REPLICAS``)


class LeftReplicas:
    """Replica ids the request router dropped, the least recent forgotten past ``max_ids``."""

    def __init__(self, max_ids: int = MAX_REMEMBERED) -> None:
        self._lock = threading.Lock()
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._max_ids = max_ids

    def mark(self, replica_id: str, how: str) -> None:
        """``replica_id`` left the router (``how``: why, for the one log line per replica)."""
        with self._lock:
            if replica_id in self._ids:
                return
            self._ids[replica_id] = None
            while len(self._ids) > self._max_ids:
                self._ids.popitem(last=False)
        _log.warning(
            "fleet: engine replica %s left Ray Serve's request router (%s): out of the "
            "ingress's rotation from now on (Ray Serve replaces a replica that died)",
            replica_id,
            how,
        )

    def mark_dropped(self, before: Iterable[str], after: Iterable[str]) -> None:
        """The router's replica set went from ``before`` to ``after`` (Ray Serve's controller
        removed a replica that died, or one it stops: a scale-down, a redeploy)."""
        for replica_id in sorted(set(before) - set(after)):
            self.mark(replica_id, "Ray Serve's controller removed it: it died or is stopping")

    def __contains__(self, replica_id: object) -> bool:
        with self._lock:
            return replica_id in self._ids


LEFT_REPLICAS = LeftReplicas()  # this process's (the ingress's) request router marks here
