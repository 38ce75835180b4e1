"""What a (re)started ingress's ``FleetStanding`` starts from: the durable records of the
standing state, since the one the last ingress kept in memory died with it.

- **Tenant settings and warm policies**: the registry (the admin API writes it first, then
  applies the change to the fleet). Replayed whole to every replica once, so a replica that
  missed a change while out of rotation, before the last ingress died, is brought in line.
- **A release's pins** (the candidate's prewarm, the baseline's hold): the registry's releases
  that still need work, as the release controller would pin them. Its first ticks pin and lift
  them again; standing from the start, they are not lifted meanwhile.
- **What each replica holds**: its own report (``board.PINS_KEY``: the pins an ingress sent it
  and no unpin lifted), taken when the ingress first sees the replica. So a pin that no longer
  stands is lifted on a replica whatever ingress pinned it.
- **An operator's pins**: no record but the replicas'. A pin every healthy replica holds at the
  ingress's first poll with one stands again (``adopted_pins``); one only some hold (the last
  ingress lifted it while the others were out of rotation) does not.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.engine.tenant_shares import TenantSettings
from loraplex.fleet.board import PINS_KEY, BoardEntry
from loraplex.registry import Registry
from loraplex.release.store import ReleaseStore
from loraplex.residency.ledger import Tier
from loraplex.serve.engine_settings import tenant_settings, warm_policies
from loraplex.serve.release_env import HOLD_TIER, prewarm_tiers
from loraplex.server.pin_owners import OPERATOR, RELEASE

_log = logging.getLogger(__name__)
PinKey = tuple[AdapterKey, Tier]


@dataclass(frozen=True)
class Restored:
    """The standing state the durable records give an ingress at its start."""

    release_pins: frozenset[PinKey] = frozenset()  # the registry's releases' pins (they stand)
    release_keys: frozenset[AdapterKey] = frozenset()  # every revision those releases name
    warm: Mapping[AdapterKey, WarmPolicy] = field(default_factory=dict)  # non-default ones
    tenants: Mapping[str, TenantSettings] | None = None  # None: none to replay


def read_restored(registry: Registry, base_digest: str, now: float) -> Restored:
    """The registry's part (``now``: epoch seconds, the release controller's clock)."""
    pins: set[PinKey] = set()
    keys: set[AdapterKey] = set()
    for release in ReleaseStore(registry).needing_work():
        candidate = registry.get_revision(release.candidate_ref).key()
        baseline = registry.get_revision(release.baseline_ref).key()
        keys |= {candidate, baseline}
        if not release.terminal:
            pins |= {(candidate, tier) for tier in prewarm_tiers(release.plan.gpu)}
            pins.add((baseline, HOLD_TIER))
        elif release.hold_until is not None and now < release.hold_until:
            pins.add((baseline, HOLD_TIER))
    return Restored(
        frozenset(pins),
        frozenset(keys),
        warm_policies(registry, base_digest),
        tenant_settings(registry),
    )


def reported_pins(entry: BoardEntry) -> set[PinKey]:
    """The pins ``entry``'s replica reports holding; an item that is not one is logged and
    skipped (a replica of another version)."""
    pins: set[PinKey] = set()
    items = entry.status.get(PINS_KEY, ())
    for item in items if isinstance(items, list | tuple) else (items,):
        match item:
            case (AdapterKey() as key, Tier() as tier):
                pins.add((key, tier))
            case _:
                _log.warning("replica %s reported a pin %r; skipped", entry.replica_id, item)
    return pins


def adopted_pins(entries: Iterable[BoardEntry]) -> set[PinKey] | None:
    """The pins every healthy replica holds; None while none is healthy (nothing to go by)."""
    held = [reported_pins(e) for e in entries if e.healthy]
    if not held:
        return None
    return set.intersection(*held)


def pin_owners(pins: Iterable[PinKey], restored: Restored) -> dict[PinKey, str]:
    """Who holds each adopted pin (``server.pin_owners``): a release's when a release that
    needs work names the revision (its controller lifts it), else an operator's."""
    return {pin: RELEASE if pin[0] in restored.release_keys else OPERATOR for pin in pins}
