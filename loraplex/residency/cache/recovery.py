"""Start-up adoption of the L2 copies a previous process left behind.

Torch-free; runs under the cache's lock once verification (off the lock) is done. Linear in the
number of copies: victims are ranked only when a copy does not fit in the free room.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress

from loraplex.artifacts.identity import AdapterKey
from loraplex.errors import AdapterTooLargeError
from loraplex.residency.cache.tier_state import TierState
from loraplex.residency.ledger import ResidentEntry, Tier
from loraplex.residency.pipeline import RecoveredCopy


def adopt_recovered(state: TierState, copies: Sequence[RecoveredCopy]) -> list[AdapterKey]:
    """Adopts ``copies`` oldest first, evicting by the policy where they exceed the L2 budget;
    returns the keys dropped (copies that could not stay, and victims)."""
    ledger, now = state.ledgers[Tier.L2], state.clock.now()
    dropped: list[AdapterKey] = []
    for copy in sorted(copies, key=lambda c: (-c.age_s, c.key)):
        history = state.restore_access(copy.key, now - copy.age_s)
        victims: list[ResidentEntry] | None = None
        if copy.key not in ledger.entries:
            with suppress(AdapterTooLargeError):
                ledger.check_admissible(copy.key.tenant, copy.size_bytes)
                victims = ledger.plan_room(
                    copy.key.tenant, copy.size_bytes, lambda: state.ranked_victims(Tier.L2)
                )
        if victims is None:
            state.drop_bytes(Tier.L2, copy.key)
            state.settle_key(copy.key)
            dropped.append(copy.key)
            continue
        for victim in victims:
            state.evict(victim)
            dropped.append(victim.key)
        entry = state.reserve(Tier.L2, copy.key, copy.size_bytes)
        entry.last_access_s = history.last_access_s
        state.mark_ready(entry)
    return dropped
