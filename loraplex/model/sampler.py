"""Next-token selection: greedy, or temperature / min-p / top-k / top-p sampling with a
per-request ``torch.Generator`` so a seeded request draws the same tokens whatever else shares
its batch; logit bias and penalties before either; logprobs from the raw logits.

The order is vLLM's: logit bias on the raw logits, then the repetition penalty (prompt and
output tokens), then frequency and presence penalties (output tokens), then temperature, min-p,
top-k and top-p. Greedy rows take the argmax of the biased, penalised logits. A batch in which
no row uses bias, penalties or min-p takes the old path: one argmax for the greedy rows.

Sampling is robust per row: a row whose logits are not finite (an adapter with huge weights),
whose logit bias names a token outside the vocabulary, or whose draw fails is reported as that
row's failure, never raised for the whole batch, so one request's values cannot end another
request's generation."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from loraplex.sampling import SamplingParams, TokenLogprob


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    """The request's own random stream (None for greedy requests: they draw nothing)."""
    if params.greedy:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(params.seed if params.seed is not None else secrets.randbits(63))
    return generator


@dataclass(frozen=True)
class RowHistory:
    """One row's tokens so far; only rows with a penalty carry one (building it costs a copy)."""

    prompt: Sequence[int]  # prompt token ids (the repetition penalty reads them)
    output: Sequence[int]  # generated token ids (every penalty reads them)


class PenaltyCounts:
    """What a request's penalties read, kept across its steps: how often each token occurs in
    its output, and which tokens its prompt holds. ``advance`` counts only the output tokens
    added since the last call, so a step costs work per new token, not per token of the
    context.

    NOTE: the penalties read the whole history as Python ints on every step (a tensor of the
    output, and of the prompt for ``repetition_penalty``), on the engine thread that steps every
    tenant: a request's cost per token grew with its context, any tenant could ask for it on
    every seat it holds, and the step work share counts tokens, not this CPU
    (docs/benchmarks/attack28.md)."""

    def __init__(self, prompt: Sequence[int], vocab: int, device: torch.device) -> None:
        self.prompt = prompt  # the request's prompt, as given (``advance`` checks it is the same)
        ids = torch.as_tensor(list(prompt), dtype=torch.int64, device=device)
        self.in_prompt = torch.zeros(vocab, dtype=torch.bool, device=device)
        self.in_prompt[ids[(ids >= 0) & (ids < vocab)]] = True
        self.counts = torch.zeros(vocab, dtype=torch.float32, device=device)  # output counts
        self.num_output = 0  # output tokens counted so far

    @classmethod
    def of(cls, history: RowHistory, vocab: int, device: torch.device) -> PenaltyCounts:
        """The counts of ``history`` from nothing (what a request's first step builds)."""
        return cls(history.prompt, vocab, device).advance(history)

    def advance(self, history: RowHistory) -> PenaltyCounts:
        """These counts brought up to ``history`` (the same request, its output grown); a
        history they cannot follow (another prompt, a shorter output) is counted afresh."""
        output = history.output
        vocab, device = self.counts.numel(), self.counts.device
        if history.prompt is not self.prompt or len(output) < self.num_output:
            return PenaltyCounts.of(history, vocab, device)
        if len(output) > self.num_output:
            new = torch.as_tensor(list(output[self.num_output :]), dtype=torch.int64, device=device)
            new = new[(new >= 0) & (new < vocab)]
            self.counts.index_add_(0, new, torch.ones(new.numel(), device=device))
            self.num_output = len(output)
        return self


def process_logits(
    logits: torch.Tensor, params: SamplingParams, history: RowHistory | PenaltyCounts | None
) -> torch.Tensor:
    """Logit bias, then the penalties, on one row of raw float32 logits [vocab]. ValueError
    names the field when a bias token is outside the vocabulary or a penalty has no history.
    ``history``: the row's tokens, or its counts kept across steps (``PenaltyCounts``)."""
    vocab = logits.numel()
    if params.logit_bias:
        ids = [token for token, _ in params.logit_bias]
        if max(ids) >= vocab:
            raise ValueError(f"logit_bias token id {max(ids)} is outside the vocabulary ({vocab})")
        biases = torch.tensor([b for _, b in params.logit_bias], dtype=logits.dtype)
        logits = logits.index_add(0, torch.tensor(ids, device=logits.device), biases.to(logits))
    if not params.penalized:
        return logits
    if history is None:
        raise ValueError("presence/frequency/repetition_penalty need the row's token history")
    if isinstance(history, RowHistory):
        history = PenaltyCounts.of(history, vocab, logits.device)
    if history.counts.numel() != vocab:
        raise ValueError(
            f"penalty counts cover {history.counts.numel()} tokens; expected {vocab} (the logits)"
        )
    counts = history.counts.to(logits.dtype)
    if params.repetition_penalty != 1.0:
        seen = history.in_prompt | (counts > 0)
        penalty = params.repetition_penalty
        scaled = torch.where(logits > 0, logits / penalty, logits * penalty)
        logits = torch.where(seen, scaled, logits)
    return logits - params.frequency_penalty * counts - params.presence_penalty * (counts > 0)


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then min-p, top-k and top-p on one row of float32 logits [vocab]."""
    logits = logits / params.temperature
    if params.min_p > 0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
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


def token_logprobs(
    logits: torch.Tensor, tokens: Sequence[int], num_top: Sequence[int]
) -> list[TokenLogprob]:
    """Row i's logprob of ``tokens[i]``, its rank (1 = best; ties rank below, as vLLM) and its
    ``num_top[i]`` best (token, logprob), from raw logits [rows, vocab]: one log-softmax and
    one top-k for all rows."""
    logprobs = torch.log_softmax(logits.float(), -1)
    index = torch.as_tensor(list(tokens), dtype=torch.int64, device=logprobs.device)
    chosen = logprobs.gather(1, index.unsqueeze(1))
    ranks = (logprobs >= chosen).sum(-1).tolist()
    width = max(num_top, default=0)
    top_values, top_ids = logprobs.topk(width, -1) if width else (logprobs[:, :0], index[:0])
    values, ids = top_values.tolist(), top_ids.tolist()
    return [
        TokenLogprob(
            token_id=int(token),
            logprob=float(lp),
            rank=int(rank),
            top=tuple(zip(ids[i][:n], values[i][:n], strict=True)) if width else (),
        )
        for i, (token, lp, rank, n) in enumerate(
            zip(tokens, chosen.squeeze(1).tolist(), ranks, num_top, strict=True)
        )
    ]


@dataclass(frozen=True)
class Sampled:
    """One step's picks, per row of the logits."""

    tokens: dict[int, int] = field(default_factory=dict)  # row -> sampled token id
    failures: dict[int, str] = field(default_factory=dict)  # row -> why it could not sample
    # failed rows whose raw logits were finite: their own sampling values broke them
    request_faults: set[int] = field(default_factory=set)
    logprobs: dict[int, TokenLogprob] = field(default_factory=dict)  # rows that asked for them


def sample_rows(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    banned: Sequence[frozenset[int]] | None = None,
    histories: Sequence[RowHistory | PenaltyCounts | None] | None = None,
) -> Sampled:
    """One token per row of ``logits`` [num_rows, vocab], or that row's failure. ``banned``
    token ids cannot be picked for that row (EOS before ``min_tokens``); ``histories`` feed the
    penalties of the rows that use one."""
    raw = logits.float()
    finite = torch.isfinite(raw).all(-1).tolist()  # before banning adds -inf on purpose
    out = Sampled()
    logits = _processed(raw, params, banned, histories, out.failures)
    chosen = logits.argmax(-1).tolist()
    for row, (p, generator) in enumerate(zip(params, generators, strict=True)):
        if row in out.failures:
            continue
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
    out.request_faults.update(row for row in out.failures if finite[row])
    rows = [r for r, p in enumerate(params) if p.logprobs is not None and r in out.tokens]
    if rows:
        found = token_logprobs(
            raw[rows], [out.tokens[r] for r in rows], [params[r].logprobs or 0 for r in rows]
        )
        out.logprobs.update(zip(rows, found, strict=True))
    return out


def _processed(
    raw: torch.Tensor,
    params: Sequence[SamplingParams],
    banned: Sequence[frozenset[int]] | None,
    histories: Sequence[RowHistory | PenaltyCounts | None] | None,
    failures: dict[int, str],
) -> torch.Tensor:
    """``raw`` with banned tokens at -inf and each row's bias and penalties applied; ``raw``
    itself (no copy) when no row needs either. A row that cannot be processed goes in
    ``failures``."""
    featured = [row for row, p in enumerate(params) if p.processes_logits]
    if not featured and not (banned is not None and any(banned)):
        return raw
    logits = raw.clone()
    vocab = raw.shape[-1]
    for row, tokens_out in enumerate(banned or ()):
        in_vocab = sorted(t for t in tokens_out if t < vocab)  # others can never be picked
        if in_vocab:
            logits[row, in_vocab] = float("-inf")
    for row in featured:
        history = None if histories is None else histories[row]
        try:
            logits[row] = process_logits(logits[row], params[row], history)
        except ValueError as exc:
            failures[row] = str(exc)
            continue
        # NOTE: finite logits can overflow here (a tiny repetition penalty divides them): an
        # argmax among several +inf (or over NaN) picks an arbitrary token and reports success.
        # -inf is fine (a banned or biased-away token); a row with no finite logit is not.
        row_logits = logits[row]
        if bool(torch.isnan(row_logits).any() | torch.isposinf(row_logits).any()) or not bool(
            torch.isfinite(row_logits).any()
        ):
            failures[row] = "its sampling values made the logits non-finite (inf or NaN)"
    return logits
