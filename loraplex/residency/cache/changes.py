"""A bounded log of residency changes, so readers copy deltas instead of the whole map.

Torch-free; mutated under the cache's lock. Every change of a key's set of READY tiers bumps a
monotonic version and appends (version, key); a reader that last saw version ``v`` asks for the
keys changed after ``v`` and gets their current tiers (O(changes)), or, when ``v`` is older than
the log reaches back (or 0), the whole map with ``full=True``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from loraplex.artifacts.identity import AdapterKey
from loraplex.residency.ledger import Tier

# Changes remembered for delta readers; a reader further behind gets the full map.
DEFAULT_MAX_CHANGES = 4096


@dataclass(frozen=True)
class ResidencyChanges:
    """Which keys' ready tiers changed after a version (or the whole map)."""

    version: int  # the current version: pass it as ``since`` next time
    tiers: Mapping[AdapterKey, tuple[Tier, ...]]  # ready tiers, fastest first; () = nowhere
    full: bool  # True: ``tiers`` is the whole current map (replace, don't merge)


class ChangeLog:
    """Monotonic version plus the last ``max_changes`` (version, key) pairs."""

    def __init__(self, max_changes: int = DEFAULT_MAX_CHANGES) -> None:
        if max_changes < 1:
            raise ValueError(f"max_changes {max_changes} is invalid; expected >= 1")
        self.version = 0
        self._log: deque[tuple[int, AdapterKey]] = deque(maxlen=max_changes)

    def note(self, key: AdapterKey) -> None:
        """Records that ``key``'s set of ready tiers changed."""
        self.version += 1
        self._log.append((self.version, key))

    def since(
        self,
        since: int,
        tiers_of: Callable[[AdapterKey], tuple[Tier, ...]],
        everything: Callable[[], Iterable[tuple[AdapterKey, tuple[Tier, ...]]]],
    ) -> ResidencyChanges:
        """The changes after ``since``: O(changes), or the full map when ``since`` <= 0 or the
        log no longer reaches back to it."""
        oldest = self._log[0][0] if self._log else self.version + 1
        if since <= 0 or since < oldest - 1:
            return ResidencyChanges(self.version, dict(everything()), full=True)
        changed: dict[AdapterKey, tuple[Tier, ...]] = {}
        for version, key in reversed(self._log):
            if version <= since:
                break
            if key not in changed:
                changed[key] = tiers_of(key)
        return ResidencyChanges(self.version, changed, full=False)
