"""What the scheduler plans and the runner executes: one forward's chunks (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass, field

from loraplex.sampling import TokenLogprob


@dataclass(frozen=True)
class ScheduledChunk:
    """Consecutive tokens of one request in the next forward."""

    request_id: str  # whose tokens
    seq_id: int  # its KV sequence (BlockManager handle)
    start_pos: int  # position of the first token (= tokens already cached)
    token_ids: tuple[int, ...]  # the tokens to run
    slot: int | None  # LoRA slot of its adapter lease; None = base model
    samples: bool  # the chunk ends at the sequence's last token: sample the next one
    # The prompt tokens this chunk's positions predict (prompt[start_pos + 1 : start_pos + n
    # + 1]) when its request asked for ``prompt_logprobs``: the forward then returns logits at
    # every position of this chunk. None: only the last position's logits (if it samples).
    logprob_targets: tuple[int, ...] | None = None


@dataclass(frozen=True)
class StepPlan:
    """What one forward runs."""

    chunks: tuple[ScheduledChunk, ...]  # in token order of the flattened batch
    preempted: tuple[str, ...]  # request ids whose KV was freed this step

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)


@dataclass(frozen=True)
class PromptLogprobs:
    """Logprobs of consecutive prompt tokens, computed by one chunk."""

    first_position: int  # prompt position of the token ``entries[0]`` scores (>= 1)
    entries: tuple[TokenLogprob, ...]  # one per prompt token from there on


@dataclass(frozen=True)
class StepResult:
    """What one executed plan produced, per request."""

    sampled: dict[str, int]  # request id -> the token it sampled this step
    failed: dict[str, str]  # request id -> why its part of the step failed (it alone ends)
    # request id -> the sampled token's logprobs (requests that asked for ``logprobs``)
    logprobs: dict[str, TokenLogprob] = field(default_factory=dict)
    # request id -> this step's prompt logprobs (requests whose chunk has logprob_targets)
    prompt_logprobs: dict[str, PromptLogprobs] = field(default_factory=dict)
    # failed request ids whose own sampling values (not the model) caused the failure
    request_faults: set[str] = field(default_factory=set)
