"""What the simulator records of one request (filled in as its events happen)."""

from __future__ import annotations

from dataclasses import dataclass


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

    @property
    def ok(self) -> bool:
        return self.error is None and self.end_s is not None
