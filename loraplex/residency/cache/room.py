"""``Room``: what one tier can offer a prepared load, read by ``placement.decide``.

Torch-free; read under the cache's lock. Every answer is computed only when the decision asks
for it: victims come lazily from the tier's victim index, and the copies a deferral weighs are
listed only when the policy reads them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import overload

from loraplex.artifacts.identity import AdapterKey
from loraplex.errors import AdapterTooLargeError
from loraplex.residency.cache.config import share_outranks
from loraplex.residency.cache.tier_state import TierState
from loraplex.residency.ledger import ResidentEntry
from loraplex.residency.pipeline import Footprint, Move
from loraplex.residency.policy import Candidate

# A deferral shorter than this displaces at once. NOTE: the rest of a bound (the policy's or
# max_request_deferral_s) can come out as a few ulps of the clock; a timer that short fires at
# the same instant and re-decides with the same waited time, forever.
MIN_DEFERRAL_S = 1e-3


class TierRoom:
    """``Room`` over one tier's ledger and the policy (victims ranked on first need only)."""

    def __init__(
        self,
        state: TierState,
        move: Move,
        footprint: Footprint,
        request_waited_s: float,
        charged: str | None = None,
    ) -> None:
        self._state = state
        self._move = move
        # whose share and cap the room comes from: the load's requester (None: the owner)
        self._tenant = charged or move.key.tenant
        self._ledger = state.ledgers[move.target]
        self._size = footprint.bytes_in(move.target)
        self._waited_s = request_waited_s  # since the load's longest-waiting request asked

    def too_large(self) -> AdapterTooLargeError | None:
        try:
            self._ledger.check_admissible(self._tenant, self._size)
        except AdapterTooLargeError as error:
            return error
        return None

    def victims(self) -> Sequence[ResidentEntry] | None:
        target, config = self._move.target, self._state.config
        return self._ledger.plan_room(
            self._tenant,
            self._size,
            lambda: self._state.ranked_victims(target),
            (lambda a, b: share_outranks(config, a, b)) if config.tier_share_by_priority else None,
        )

    def admits(self, victims: Sequence[ResidentEntry]) -> bool:
        state, now = self._state, self._state.clock.now()
        return state.policy.admits(self._incoming(), [state.candidate(v) for v in victims], now)

    def deferral_s(self, victims: Sequence[ResidentEntry]) -> float:
        """The copies a demand load may wait for are the tier's unpinned entries that are not
        victims: in use, still loading, or too young to go (an idle old one that is cheaper
        would be a victim). They are listed only if the policy looks at them (O(copies)).
        Whatever the policy answers, no request is deferred past ``max_request_deferral_s``
        in total: protecting one tenant's copies never starves another's requests."""
        state = self._state
        left = state.config.max_request_deferral_s - self._waited_s
        if left < MIN_DEFERRAL_S:
            return 0.0
        chosen = {v.key for v in victims}
        held = _Held(state, self._ledger.entries, chosen)
        outgoing = [state.candidate(v) for v in victims]
        now = state.clock.now()
        wish = min(
            state.policy.deferral_s(self._incoming(), outgoing, held, self._waited_s, now), left
        )
        return wish if wish >= MIN_DEFERRAL_S else 0.0

    def fits_beside_pins(self) -> bool:
        return self._ledger.fits_beside_pins(self._tenant, self._size)

    def _incoming(self) -> Candidate:
        move, now = self._move, self._state.clock.now()
        return self._state.candidate_of(
            move.key, move.target, self._size, now, charged=self._tenant
        )


class _Held(Sequence[Candidate]):
    """The tier's unpinned non-victims as candidates, listed on first read (a policy that
    decides without them never pays O(copies))."""

    def __init__(
        self,
        state: TierState,
        entries: Mapping[AdapterKey, ResidentEntry],
        chosen: set[AdapterKey],
    ) -> None:
        self._state = state
        self._entries = entries
        self._chosen = chosen
        self._listed: list[Candidate] | None = None

    def _list(self) -> list[Candidate]:
        if self._listed is None:
            self._listed = [
                self._state.candidate(e)
                for e in self._entries.values()
                if e.key not in self._chosen and not e.pinned
            ]
        return self._listed

    @overload
    def __getitem__(self, index: int) -> Candidate: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Candidate]: ...

    def __getitem__(self, index: int | slice) -> Candidate | Sequence[Candidate]:
        return self._list()[index]

    def __len__(self) -> int:
        return len(self._list())
