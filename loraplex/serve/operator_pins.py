"""An operator's pins at a server's start: read back from the registry (schema 8), so a server
restart (an upgrade, a crash, a rollout) keeps them as an engine-process restart does.

The server process ``restore``s them once before it takes requests: it drops (from the
registry, logged) a pin whose revision, tenant or content is gone, and its ``OwnedPins`` adopts
the others as the operator's. The engine side pins them in its cache as it builds
(``apply``), beside the warm policies, in every engine child it starts; a fleet's ingress puts
them among the standing pins it brings every replica to (``fleet/standing_restore.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future

from loraplex.artifacts.identity import AdapterKey
from loraplex.registry import Registry
from loraplex.residency.ledger import Tier
from loraplex.server.cache_control import CacheControl

_log = logging.getLogger(__name__)
RESTORE_ACTOR = "server:restore"  # the audit log's actor of a pin dropped at start
PinKey = tuple[AdapterKey, Tier]


def restore(registry: Registry, base_digest: str) -> frozenset[PinKey]:
    """The operator's recorded pins of ``base_digest``'s revisions; those that can no longer
    be pinned are dropped from the registry and logged, never fatal."""
    restored = registry.restore_operator_pins(base_digest, RESTORE_ACTOR)
    for pin, why in restored.dropped:
        _log.warning(
            "operator pin of %s in %s dropped from the registry: %s", pin.ref, pin.tier, why
        )
    if restored.other_base:
        _log.info(
            "%d operator pins name revisions of another base model: kept in the registry, not "
            "pinned here (first: %s)",
            len(restored.other_base),
            restored.other_base[0].ref,
        )
    return frozenset((p.revision.key(), Tier[p.tier]) for p in restored.served)


def apply(registry: Registry, cache: CacheControl, base_digest: str) -> int:
    """Pins the operator's recorded pins in ``cache`` (an engine's, as it builds); returns how
    many. Each copy loads in the background; a load that fails is logged, the pin stands (a
    later request or replay loads it again)."""
    pins = registry.operator_pins(base_digest)
    for pin in pins:
        future = cache.pin(pin.revision.key(), Tier[pin.tier])
        future.add_done_callback(_log_failure(pin.revision.ref, pin.tier))
    return len(pins)


def _log_failure(ref: str, tier: str) -> Callable[[Future[None]], None]:
    def done(future: Future[None]) -> None:
        if not future.cancelled() and future.exception() is not None:
            _log.warning("operator pin of %s in %s: load failed: %s", ref, tier, future.exception())

    return done
