"""Executes a StepPlan: builds the flattened batch with per-token LoRA slots, runs the model
under the adapter cache's slot lock, and samples the chunks that reached their sequence's end."""

from __future__ import annotations

import threading
from collections.abc import Mapping

import torch

from loraplex.engine.kv_blocks import PagedKVCache
from loraplex.engine.step import StepPlan
from loraplex.model.kv_cache import SequenceChunk
from loraplex.model.llama import ForwardBatch, LlamaModel, LoraApplier
from loraplex.model.sampler import SamplingParams, make_generator, sample_next

# The op's tensor convention for "base model only" in token_slots.
_NO_SLOT = -1


class ModelRunner:
    """The model, its paged KV cache and the LoRA slot pool shared with the adapter cache."""

    def __init__(
        self,
        model: LlamaModel,
        kv: PagedKVCache,
        lora: LoraApplier | None,
        slot_lock: threading.Lock,
    ) -> None:
        self.model = model
        self.kv = kv
        self.lora = lora
        # NOTE: the cache's worker threads rebuild the pool's views when they fill a slot; the
        # forward must not overlap that, so it holds the same lock.
        self.slot_lock = slot_lock
        self._generators: dict[str, torch.Generator | None] = {}

    def run(
        self,
        plan: StepPlan,
        params: Mapping[str, SamplingParams],
        banned: Mapping[str, frozenset[int]] | None = None,
    ) -> dict[str, int]:
        """One forward over ``plan``; returns the sampled token of every sampling chunk.
        ``banned`` token ids cannot be sampled for that request this step (EOS before
        ``min_tokens``)."""
        chunks = [SequenceChunk(c.seq_id, c.start_pos, len(c.token_ids)) for c in plan.chunks]
        tokens = [t for c in plan.chunks for t in c.token_ids]
        slots = None
        if self.lora is not None and any(c.slot is not None for c in plan.chunks):
            slots = [
                _NO_SLOT if c.slot is None else c.slot for c in plan.chunks for _ in c.token_ids
            ]
        batch = ForwardBatch.build(tokens, chunks, token_slots=slots, device=self.model.device)
        with self.slot_lock:
            logits = self.model.forward_batch(batch, self.kv, self.lora)
        rows = [i for i, c in enumerate(plan.chunks) if c.samples]
        if not rows:
            return {}
        ids = [plan.chunks[i].request_id for i in rows]
        picked = logits[rows]
        for row, request_id in enumerate(ids):
            tokens_out = (banned or {}).get(request_id)
            if tokens_out:
                picked[row, sorted(tokens_out)] = float("-inf")
        chosen = sample_next(
            picked, [params[r] for r in ids], [self._generator(r, params[r]) for r in ids]
        )
        return dict(zip(ids, chosen, strict=True))

    def drop(self, request_id: str) -> None:
        """Forget a finished request's random stream."""
        self._generators.pop(request_id, None)

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator | None:
        if request_id not in self._generators:
            self._generators[request_id] = make_generator(params, self.model.device)
        return self._generators[request_id]
