"""Executes a StepPlan: builds the flattened batch with per-token LoRA slots, runs the model
under the adapter cache's slot lock, and samples the chunks that reached their sequence's end.
A request whose row cannot be sampled (non-finite logits, a failed draw) is reported in
``StepResult.failed``; the other rows are unaffected."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

import torch

from loraplex.engine.kv_blocks import PagedKVCache
from loraplex.engine.step import StepPlan, StepResult
from loraplex.model.kv_cache import SequenceChunk
from loraplex.model.llama import ForwardBatch, LlamaModel, LoraApplier
from loraplex.model.sampler import make_generator, sample_rows
from loraplex.sampling import SamplingParams

_log = logging.getLogger(__name__)

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
    ) -> StepResult:
        """One forward over ``plan``; the sampled token of every sampling chunk, or why it
        could not sample. ``banned`` token ids cannot be sampled for that request this step
        (EOS before ``min_tokens``)."""
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
            return StepResult({}, {})
        ids = [plan.chunks[i].request_id for i in rows]
        generators: list[torch.Generator | None] = []
        failed: dict[str, str] = {}
        for request_id in ids:
            try:
                generators.append(self._generator(request_id, params[request_id]))
            except RuntimeError as exc:  # e.g. a seed torch refuses
                generators.append(None)
                failed[request_id] = f"its random generator failed: {str(exc)[:200]}"
        picked = sample_rows(
            logits[rows],
            [params[r] for r in ids],
            generators,
            [(banned or {}).get(r, frozenset()) for r in ids],
        )
        failed.update({ids[row]: reason for row, reason in picked.failures.items()})
        sampled = {ids[row]: token for row, token in picked.tokens.items()}
        return StepResult({r: t for r, t in sampled.items() if r not in failed}, failed)

    def run_isolated(
        self,
        plan: StepPlan,
        params: Mapping[str, SamplingParams],
        banned: Mapping[str, frozenset[int]],
    ) -> StepResult:
        """``run``; if the forward raises, runs each chunk alone so that only the request whose
        part raises fails (with its error's type only: its text may carry one tenant's values),
        and the others still advance. Rerunning is safe: a chunk writes the same keys/values to
        the same KV rows again."""
        try:
            return self.run(plan, params, banned)
        except Exception:
            _log.exception("engine step of %d chunks failed; isolating", len(plan.chunks))
        sampled: dict[str, int] = {}
        failed: dict[str, str] = {}
        for chunk in plan.chunks:
            rid = chunk.request_id
            mine = {rid: params[rid]} if rid in params else {}
            try:
                result = self.run(StepPlan((chunk,), ()), mine, banned)
            except Exception as exc:
                _log.warning("request %s fails alone: %r", rid, exc)
                failed[rid] = f"its part of the step raised {type(exc).__name__}"
                continue
            sampled.update(result.sampled)
            failed.update(result.failed)
        return StepResult(sampled, failed)

    def drop(self, request_id: str) -> None:
        """Forget a finished request's random stream."""
        self._generators.pop(request_id, None)

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator | None:
        if request_id not in self._generators:
            self._generators[request_id] = make_generator(params, self.model.device)
        return self._generators[request_id]
