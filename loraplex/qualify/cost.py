"""What a correct answer costs: machine prices and the one formula every method is priced by.

cost per correct request = price per machine-hour x machines x wall hours / requests that passed
every check (correct revision, quality, latency, isolation). ``None`` when no request passed: an
undefined cost is reported as null, never as 0.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MachinePrice:
    """One machine class and what an hour of it costs, with where the figure comes from."""

    name: str
    usd_per_hour: float
    source: str

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("MachinePrice.name must not be empty")
        if not self.usd_per_hour > 0:
            raise ValueError(f"MachinePrice.usd_per_hour must be > 0, got {self.usd_per_hour!r}")
        if not self.source:
            raise ValueError(f"MachinePrice.source must say where {self.name!r}'s price comes from")


@dataclass(frozen=True)
class TokenShape:
    """A cell's request shape: prompt and output tokens per request."""

    name: str
    prompt_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"TokenShape.prompt_tokens must be >= 1, got {self.prompt_tokens}")
        if self.output_tokens < 1:
            raise ValueError(f"TokenShape.output_tokens must be >= 1, got {self.output_tokens}")


# The plan's token-shape axis (issue 29): short/short, a 1,024-token prompt, a 256-token output.
TOKEN_SHAPES: dict[str, TokenShape] = {
    shape.name: shape
    for shape in (
        TokenShape("short", prompt_tokens=32, output_tokens=16),
        TokenShape("long-prompt", prompt_tokens=1024, output_tokens=16),
        TokenShape("long-output", prompt_tokens=32, output_tokens=256),
    )
}


def cost_per_correct_request(
    price: MachinePrice, machines: float, wall_s: float, correct_requests: int
) -> float | None:
    """USD per request that passed every check; None when none passed (undefined, not free)."""
    if machines < 0:
        raise ValueError(f"machines must be >= 0, got {machines}")
    if wall_s < 0:
        raise ValueError(f"wall_s must be >= 0, got {wall_s}")
    if correct_requests <= 0:
        return None
    return price.usd_per_hour * machines * (wall_s / 3600.0) / correct_requests
