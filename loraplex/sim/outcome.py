"""What the simulator records of one request (filled in as its events happen)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias


@dataclass(slots=True)
class Outcome:
    """One request's fate; times on the virtual clock, seconds from the trace's start."""

    t_s: float  # arrival at the front (the trace's t_s)
    tenant: str  # the requesting tenant
    replica: int = -1  # the replica it went to (-1: none yet)
    tier: str | None = None  # tier its adapter's lease came from; None: base model or no lease
    first_token_s: float | None = None  # when its first token reached the client
    end_s: float | None = None  # when it ended (finished or failed)
    output_tokens: int = 0  # tokens generated
    error: str | None = None  # the domain error that ended it (class name); None: finished
    reason: str | None = None  # fleet: the router's reason for its replica; None: one server
    # the server's error code when it was refused at arrival, before any queue (``sim/refusal``:
    # a 400, no TTFT); None: it reached an engine
    refused: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.end_s is not None


# An ended request's ``Outcome`` as its fields in order (``Outcome(*fields)`` restores it).
Sealed: TypeAlias = tuple[
    float, str, int, str | None, float | None, float | None, int, str | None, str | None, str | None
]


class OutcomeLog:
    """Every request's outcome in trace order. Every ``seal_every`` requests, the ones that ended
    since are kept as plain tuples of strings and numbers (``Sealed``), which the cyclic garbage
    collector stops tracking: a scale run keeps a million outcomes to the end, and every full
    collection walked them all (docs/simulator.md, "Scale"). An ended outcome never changes
    again (the replica that ended it has let it go), so ``outcomes()`` gives the same records."""

    def __init__(self, seal_every: int = 4096) -> None:
        if seal_every < 1:
            raise ValueError(f"seal_every {seal_every} is invalid; expected >= 1")
        self._seal_every = seal_every
        self._items: list[Outcome | Sealed] = []
        self._open: list[int] = []  # positions below ``_looked`` still live at the last seal
        self._looked = 0  # positions below this one were looked at by a seal
        self.num_sealed = 0

    def add(self, outcome: Outcome) -> None:
        self._items.append(outcome)
        if len(self._items) % self._seal_every == 0:
            self._seal()

    def outcomes(self) -> list[Outcome]:
        return [o if isinstance(o, Outcome) else Outcome(*o) for o in self._items]

    def _seal(self) -> None:
        """Seals the ended outcomes among those not sealed yet: O(new + still live)."""
        items, live = self._items, []
        for i in (*self._open, *range(self._looked, len(items))):
            o = items[i]
            assert isinstance(o, Outcome)  # only live ones are looked at again
            if o.end_s is None:
                live.append(i)
                continue
            items[i] = (
                o.t_s,
                o.tenant,
                o.replica,
                o.tier,
                o.first_token_s,
                o.end_s,
                o.output_tokens,
                o.error,
                o.reason,
                o.refused,
            )
            self.num_sealed += 1
        self._open, self._looked = live, len(items)
