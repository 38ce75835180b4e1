"""The offline decode loop: prefill every prompt in one forward, then one token per sequence per
step, reusing cached keys/values, until each sequence hits EOS, a stop string or max_tokens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from loraplex.model.kv_cache import ContiguousKVCache, SequenceChunk
from loraplex.model.llama import ForwardBatch, LlamaModel, LoraApplier
from loraplex.model.sampler import make_generator, sample_next
from loraplex.sampling import SamplingParams

FINISH_STOP = "stop"  # EOS token or a stop string
FINISH_LENGTH = "length"  # max_tokens reached


class Detokenizer(Protocol):
    def decode(self, token_ids: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class SequenceInput:
    """One sequence to continue."""

    prompt_ids: tuple[int, ...]  # tokenized prompt (at least one token)
    slot: int | None  # LoRA slot of its adapter; None = base model only
    params: SamplingParams  # sampling and stopping


@dataclass(frozen=True)
class SequenceOutput:
    """What one sequence produced."""

    token_ids: tuple[int, ...]  # generated ids, including the EOS or stop-completing token
    text: str  # decoded continuation, cut before a stop string; specials skipped
    finish_reason: str  # FINISH_STOP or FINISH_LENGTH


@dataclass
class _Running:
    """Mutable per-sequence progress inside one decode loop."""

    spec: SequenceInput
    seq_id: int
    generator: torch.Generator | None
    out: list[int] = field(default_factory=list)
    result: SequenceOutput | None = None

    @property
    def length(self) -> int:
        return len(self.spec.prompt_ids) + len(self.out)


def decode(
    model: LlamaModel,
    inputs: Sequence[SequenceInput],
    *,
    eos_token_ids: frozenset[int],
    detokenizer: Detokenizer,
    lora: LoraApplier | None = None,
) -> list[SequenceOutput]:
    """Continue every input as one batch; outputs are in input order."""
    if any(not s.prompt_ids for s in inputs):
        raise ValueError("prompt_ids is empty; expected at least one token per sequence")
    max_len = max(len(s.prompt_ids) + s.params.max_tokens for s in inputs)
    kv = ContiguousKVCache(
        model.attention_shape, len(inputs), max_len, dtype=model.dtype, device=model.device
    )
    running = [_Running(s, kv.allocate(), make_generator(s.params, model.device)) for s in inputs]
    chunks = [SequenceChunk(r.seq_id, 0, len(r.spec.prompt_ids)) for r in running]
    tokens = [t for r in running for t in r.spec.prompt_ids]
    active = running
    while active:
        slots = _token_slots(active, chunks)
        batch = ForwardBatch.build(tokens, chunks, token_slots=slots, device=model.device)
        logits = model.forward_batch(batch, kv, lora if slots is not None else None)
        chosen = sample_next(logits, [r.spec.params for r in active], [r.generator for r in active])
        for r, token in zip(active, chosen, strict=True):
            r.out.append(token)
            r.result = _finished(r, eos_token_ids, detokenizer)
        active = [r for r in active if r.result is None]
        chunks = [SequenceChunk(r.seq_id, r.length - 1, 1) for r in active]
        tokens = [r.out[-1] for r in active]
    return [r.result for r in running if r.result is not None]


def _token_slots(active: list[_Running], chunks: list[SequenceChunk]) -> list[int] | None:
    if all(r.spec.slot is None for r in active):
        return None
    slots: list[int] = []
    for r, chunk in zip(active, chunks, strict=True):
        slot = r.spec.slot
        # NOTE: -1 is the op's tensor convention for "base model only".
        slots.extend([slot if slot is not None else -1] * chunk.num_tokens)
    return slots


def _finished(
    r: _Running, eos_token_ids: frozenset[int], detokenizer: Detokenizer
) -> SequenceOutput | None:
    params = r.spec.params
    if params.stop:
        text = detokenizer.decode(r.out)
        cut = min((i for s in params.stop if (i := text.find(s)) >= 0), default=None)
        if cut is not None:
            return SequenceOutput(tuple(r.out), text[:cut], FINISH_STOP)
    if r.out[-1] in eos_token_ids and not params.ignore_eos:
        return SequenceOutput(tuple(r.out), detokenizer.decode(r.out), FINISH_STOP)
    if len(r.out) >= params.max_tokens:
        return SequenceOutput(tuple(r.out), detokenizer.decode(r.out), FINISH_LENGTH)
    return None
