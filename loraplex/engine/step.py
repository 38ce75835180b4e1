"""What the scheduler plans and the runner executes: one forward's chunks (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScheduledChunk:
    """Consecutive tokens of one request in the next forward."""

    request_id: str  # whose tokens
    seq_id: int  # its KV sequence (BlockManager handle)
    start_pos: int  # position of the first token (= tokens already cached)
    token_ids: tuple[int, ...]  # the tokens to run
    slot: int | None  # LoRA slot of its adapter lease; None = base model
    samples: bool  # the chunk ends at the sequence's last token: sample the next one


@dataclass(frozen=True)
class StepPlan:
    """What one forward runs."""

    chunks: tuple[ScheduledChunk, ...]  # in token order of the flattened batch
    preempted: tuple[str, ...]  # request ids whose KV was freed this step

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)


@dataclass(frozen=True)
class StepResult:
    """What one executed plan produced, per request."""

    sampled: dict[str, int]  # request id -> the token it sampled this step
    failed: dict[str, str]  # request id -> why its part of the step failed (it alone ends)
