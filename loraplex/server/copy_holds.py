"""What holds a cached copy, in words: the reason a kept ``/admin/residency/evict`` gives and
the per-revision text of ``/v1/unload_lora_adapter``'s 409 (both admin-only routes: the words
name kinds of holder, ``operator``, ``release``, a warm policy, and counts, never a tenant or a
request)."""

from __future__ import annotations

from loraplex.residency.cache import CopyHolds
from loraplex.residency.warm import WarmHold


def warm_label(hold: WarmHold) -> str:
    """``warm_policy:gpu (automatic)``: the policy and who set it (the operator or the rates)."""
    return f"warm_policy:{hold.policy.value} ({'automatic' if hold.automatic else 'operator'})"


def held_by(owners: frozenset[str], warm: frozenset[WarmHold]) -> list[str]:
    """What pins a copy: the pin's owners, then each warm policy (``warm_label``)."""
    return sorted(owners) + sorted(warm_label(hold) for hold in warm)


def holds_text(holds: CopyHolds) -> str:
    """Each hold named: ``pinned by release; in use (2 leases or loads); loading``; empty when
    nothing holds the copy (it became evictable since the call that kept it)."""
    why: list[str] = []
    pinned_by = held_by(holds.owners, holds.warm)
    if holds.pinned and not holds.owners:
        pinned_by.insert(0, "a pin (owner unknown)")  # made around ``OwnedPins``
    if pinned_by:
        why.append(f"pinned by {', '.join(pinned_by)}")
    if holds.in_use:
        why.append(f"in use ({holds.in_use} leases or loads)")
    if holds.loading:
        why.append("loading")
    return "; ".join(why)
