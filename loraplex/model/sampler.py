"""Next-token selection: greedy, or temperature / top-k / top-p sampling with a per-request
``torch.Generator`` so a seeded request draws the same tokens whatever else shares its batch."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks tokens and when it stops."""

    max_tokens: int = 16  # tokens to generate at most
    temperature: float = 0.0  # 0 = greedy (argmax); otherwise logits are divided by it
    top_p: float = 1.0  # keep the smallest set of tokens whose probability reaches top_p
    top_k: int | None = None  # keep the k most likely tokens; None = no limit
    seed: int | None = None  # seeds this request's generator; None = fresh entropy
    stop: tuple[str, ...] = ()  # generation ends when the text contains one (it is cut off)
    ignore_eos: bool = False  # keep generating past end-of-sequence tokens
    min_tokens: int = 0  # neither EOS nor a stop string ends generation before this many tokens

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens {self.max_tokens} is invalid; expected >= 1")
        if not self.temperature >= 0:
            raise ValueError(f"temperature {self.temperature} is invalid; expected >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p {self.top_p} is invalid; expected 0 < top_p <= 1")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k {self.top_k} is invalid; expected >= 1 or None")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"min_tokens {self.min_tokens} is invalid; expected 0 <= min_tokens <= "
                f"max_tokens ({self.max_tokens})"
            )
        if any(not s for s in self.stop):
            raise ValueError(f"stop {self.stop!r} is invalid; expected non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    """The request's own random stream (None for greedy requests: they draw nothing)."""
    if params.greedy:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(params.seed if params.seed is not None else secrets.randbits(63))
    return generator


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p on one row of float32 logits [vocab]."""
    logits = logits / params.temperature
    if params.top_k is not None and params.top_k < logits.numel():
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens ranked above it already reach top_p (the top one stays).
        drop_sorted = (probs.cumsum(-1) - probs) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> list[int]:
    """One token per row of ``logits`` [num_rows, vocab]."""
    logits = logits.float()
    chosen = logits.argmax(-1).tolist()
    for row, (p, generator) in enumerate(zip(params, generators, strict=True)):
        if p.greedy:
            continue
        probs = filter_logits(logits[row], p).softmax(-1)
        chosen[row] = int(torch.multinomial(probs, 1, generator=generator))
    return [int(t) for t in chosen]
