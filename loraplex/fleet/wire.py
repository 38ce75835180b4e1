"""What travels between the ingress and the engine replicas (pickled by Ray).

A replica's ``generate`` stream starts with ``Accepted`` (which replica took the request: the
ingress aborts it there and, if the replica dies before the first token, retries elsewhere),
then ``TokenDelta``s, and ends with the last delta or with ``Failed`` (the domain error, packed
so its class survives the trip: ``QueueFullError`` stays a 429 at the ingress). ``RouteHint``
rides along as a keyword argument the request router reads. ``ReplicaLeftError`` is how a replica
refuses a call meant for another one that the request router no longer offers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loraplex.engine.transport.packed_errors import PackedError
from loraplex.errors import EngineUnavailableError


@dataclass(frozen=True)
class RouteHint:
    """How the request router treats one call (besides the request itself)."""

    # Only this replica (cache calls and release probes that must reach every replica); None:
    # the routing policy decides.
    target: str | None = None
    # Replicas not to use (a retry after one died); ignored when it would leave none.
    avoid: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Accepted:
    """First item of a replica's stream: the replica that queued the request."""

    replica_id: str


@dataclass(frozen=True)
class Failed:
    """Last item of a replica's stream when the request failed there (a domain error)."""

    error: PackedError


class ReplicaLeftError(EngineUnavailableError):
    """A call meant for one replica (``RouteHint.target``) that the ingress's request router no
    longer offers (it died, or left rotation), refused by whichever replica took it instead.
    NOTE: Ray Serve drops a dead replica from its router at once, but the board shows it healthy
    until its reports are ``stale_after_s`` old (3 s by default), so a fleet-wide change made in
    that window is sent to it too (``fleet/cache.py`` leaves it out of the answer)."""
