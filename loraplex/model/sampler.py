"""Next-token selection: greedy, or temperature / top-k / top-p sampling with a per-request
``torch.Generator`` so a seeded request draws the same tokens whatever else shares its batch.

Sampling is robust per row: a row whose logits are not finite (an adapter with huge weights)
or whose draw fails is reported as that row's failure, never raised for the whole batch, so one
request's values cannot end another request's generation."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from loraplex.sampling import SamplingParams


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
        # Drop a token when the tokens ranked above it already reach top_p. NOTE: the top one
        # always stays: a top_p below float32's smallest value compares as 0 and would drop it.
        drop_sorted = (probs.cumsum(-1) - probs) >= params.top_p
        drop_sorted[0] = False
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


@dataclass(frozen=True)
class Sampled:
    """One step's picks, per row of the logits."""

    tokens: dict[int, int] = field(default_factory=dict)  # row -> sampled token id
    failures: dict[int, str] = field(default_factory=dict)  # row -> why it could not sample


def sample_rows(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    banned: Sequence[frozenset[int]] | None = None,
) -> Sampled:
    """One token per row of ``logits`` [num_rows, vocab], or that row's failure. ``banned``
    token ids cannot be picked for that row (EOS before ``min_tokens``)."""
    logits = logits.float()
    finite = torch.isfinite(logits).all(-1).tolist()  # before banning adds -inf on purpose
    if banned is not None and any(banned):
        logits = logits.clone()
        for row, tokens_out in enumerate(banned):
            if tokens_out:
                logits[row, sorted(tokens_out)] = float("-inf")
    chosen = logits.argmax(-1).tolist()
    out = Sampled()
    for row, (p, generator) in enumerate(zip(params, generators, strict=True)):
        if not finite[row]:
            out.failures[row] = "the model produced non-finite logits (inf or NaN)"
        elif p.greedy:
            out.tokens[row] = int(chosen[row])
        else:
            try:
                probs = filter_logits(logits[row], p).softmax(-1)
                out.tokens[row] = int(torch.multinomial(probs, 1, generator=generator))
            except RuntimeError as exc:  # e.g. probabilities that are not a distribution
                out.failures[row] = f"sampling failed: {str(exc)[:200]}"
    return out
