"""What a (re)started ingress's ``FleetStanding`` starts from: the durable records of the
standing state, since the one the last ingress kept in memory died with it.

- **Tenant settings and warm policies**: the registry (the admin API writes it first, then
  applies the change to the fleet). Replayed whole to every replica once, so a replica that
  missed a change while out of rotation, before the last ingress died, is brought in line.
- **A release's pins** (the candidate's prewarm, the baseline's hold): the registry's releases
  that still need work, as the release controller would pin them. Its first ticks pin and lift
  them again; standing from the start, they are not lifted meanwhile.
- **An operator's pins**: the registry's ``operator_pins`` (schema 8; ``serve/operator_pins.py``
  drops, logged, those whose revision is gone). They stand from the start, like a release's.
- **What each replica holds**: its own report (``board.PINS_KEY``: the pins an ingress sent it
  and no unpin lifted), taken when the ingress first sees the replica. So a pin that no longer
  stands is lifted on a replica whatever ingress pinned it.
- **A pin every healthy replica holds** at the ingress's first poll with one stands again
  (``adopted_pins``) only when a release that needs work names its revision: its controller
  lifts it when done. Any other is lifted (logged): the registry is the record of an operator's
  pins, and one it does not hold was unpinned (the last ingress died before every replica
  heard) or pinned by a loraplex older than schema 8 (pin it again). NOTE: such pins were
  adopted as an operator's before the registry recorded them, so an unpin that had not reached
  every replica came back with the next ingress.
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
from loraplex.serve import operator_pins
from loraplex.serve.engine_settings import tenant_settings, warm_policies
from loraplex.serve.release_env import HOLD_TIER, prewarm_tiers
from loraplex.server.pin_owners import OPERATOR, RELEASE

_log = logging.getLogger(__name__)
PinKey = tuple[AdapterKey, Tier]  # as ``serve.operator_pins.PinKey``


@dataclass(frozen=True)
class Restored:
    """The standing state the durable records give an ingress at its start."""

    release_pins: frozenset[PinKey] = frozenset()  # the registry's releases' pins (they stand)
    release_keys: frozenset[AdapterKey] = frozenset()  # every revision those releases name
    warm: Mapping[AdapterKey, WarmPolicy] = field(default_factory=dict)  # recorded ones
    tenants: Mapping[str, TenantSettings] | None = None  # None: none to replay
    operator_pins: frozenset[PinKey] = frozenset()  # the registry's operator pins (they stand)


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
        operator_pins.restore(registry, base_digest),
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


def adopted_pins(entries: Iterable[BoardEntry], restored: Restored) -> set[PinKey] | None:
    """The pins every healthy replica holds that a release needing work names (the module
    docstring); None while none is healthy (nothing to go by). The others every healthy replica
    holds and no record names are logged: they are lifted."""
    held = [reported_pins(e) for e in entries if e.healthy]
    if not held:
        return None
    common = set.intersection(*held)
    adopted = {pin for pin in common if pin[0] in restored.release_keys}
    unrecorded = common - adopted - restored.operator_pins - restored.release_pins
    if unrecorded:
        _log.warning(
            "fleet: lifting %d pins every replica holds that neither the registry's operator "
            "pins nor a release name (unpinned before the last ingress stopped, or pinned "
            "before schema 8: pin them again): %s",
            len(unrecorded),
            ", ".join(f"{key.ref} in {tier.name}" for key, tier in sorted(unrecorded, key=str)),
        )
    return adopted


def pin_owners(pins: Iterable[PinKey], restored: Restored) -> dict[PinKey, str]:
    """Who holds each adopted pin (``server.pin_owners``): a release's when a release that
    needs work names the revision (its controller lifts it), else an operator's (the registry's
    pins, which ``build_front`` records as the operator's too)."""
    return {pin: RELEASE if pin[0] in restored.release_keys else OPERATOR for pin in pins}
