"""Executes a StepPlan: builds the flattened batch with per-token LoRA slots, runs the model
under the adapter cache's slot lock, and samples the chunks that reached their sequence's end.
A request whose row cannot be sampled (non-finite logits, a failed draw) is reported in
``StepResult.failed``; the other rows are unaffected. Chunks of requests that asked for prompt
logprobs get logits at every position; the others only at their last (they pay nothing)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import replace
from itertools import accumulate

import torch

from loraplex.engine.kv.paged import PagedKVCache
from loraplex.engine.step import PromptLogprobs, StepPlan, StepResult
from loraplex.model.kv_cache import SequenceChunk
from loraplex.model.llama import ForwardBatch, LlamaModel, LoraApplier
from loraplex.model.merge import MergedLoraApplier
from loraplex.model.sampler import (
    PenaltyCounts,
    RowHistory,
    make_generator,
    sample_rows,
    token_logprobs,
)
from loraplex.sampling import SamplingParams

_log = logging.getLogger(__name__)

# The op's tensor convention for "base model only" in token_slots.
_NO_SLOT = -1
# Steps a request's penalty counts are kept without being read (``Runner._penalty_counts``): a
# request the step work share holds back for a step or two keeps them; one preempted or paused
# longer counts afresh (its prompt and output once) when it samples again.
PENALTY_COUNTS_IDLE_STEPS = 8


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
        # Each penalized request's counts (``PenaltyCounts``), with the step that last read
        # them: kept while it samples, so a step counts only its new tokens.
        self._penalties: dict[str, tuple[PenaltyCounts, int]] = {}
        self._steps = 0  # steps that sampled (the age of ``_penalties``' entries)
        self.last_strategy = "none"  # the LoRA kernel strategy of the last forward (traces)

    def run(
        self,
        plan: StepPlan,
        params: Mapping[str, SamplingParams],
        banned: Mapping[str, frozenset[int]] | None = None,
        histories: Mapping[str, RowHistory] | None = None,
    ) -> StepResult:
        """One forward over ``plan``; the sampled token of every sampling chunk, or why it
        could not sample, with the logprobs its request asked for. ``params`` covers every
        chunk that samples or has ``logprob_targets``; ``banned`` token ids cannot be sampled
        for that request this step (EOS before ``min_tokens``); ``histories`` feed penalties."""
        if self.lora is not None:
            plan = by_slot(plan)
        chunks = [SequenceChunk(c.seq_id, c.start_pos, len(c.token_ids)) for c in plan.chunks]
        tokens = [t for c in plan.chunks for t in c.token_ids]
        slots = None
        # NOTE: while an adapter is merged, base-model tokens need the merged delta taken out,
        # so slots are passed even when no chunk has one.
        merged = isinstance(self.lora, MergedLoraApplier)
        if self.lora is not None and (merged or any(c.slot is not None for c in plan.chunks)):
            slots = [
                _NO_SLOT if c.slot is None else c.slot for c in plan.chunks for _ in c.token_ids
            ]
        full = [c.logprob_targets is not None for c in plan.chunks]
        batch = ForwardBatch.build(
            tokens, chunks, token_slots=slots, all_logits=full if any(full) else False,
            device=self.model.device,
        )  # fmt: skip
        with self.slot_lock:
            logits = self.model.forward_batch(batch, self.kv, self.lora)
        lora = self.lora
        self.last_strategy = "none" if slots is None or lora is None else lora.last_strategy
        # Each chunk's logits rows end here (full chunks have one row per token, others one).
        sizes = (len(c.token_ids) if f else 1 for c, f in zip(plan.chunks, full, strict=True))
        ends = list(accumulate(sizes))
        prompt_logprobs = _prompt_logprobs(plan, logits, ends, params)
        rows = [ends[i] - 1 for i, c in enumerate(plan.chunks) if c.samples]
        ids = [c.request_id for c in plan.chunks if c.samples]
        if not rows:
            return StepResult({}, {}, prompt_logprobs=prompt_logprobs)
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
            self._penalty_counts(ids, histories or {}),
        )
        picked_failed = {ids[row] for row in picked.failures}  # the rest: a bad seed
        failed.update({ids[row]: reason for row, reason in picked.failures.items()})
        sampled = {ids[row]: token for row, token in picked.tokens.items()}
        logprobs = {ids[row]: lp for row, lp in picked.logprobs.items() if ids[row] not in failed}
        faults = {ids[row] for row in picked.request_faults}
        faults |= {r for r in ids if r in failed and r not in picked_failed}
        return StepResult(
            {r: t for r, t in sampled.items() if r not in failed},
            failed,
            logprobs,
            {r: lp for r, lp in prompt_logprobs.items() if r not in failed},
            faults,
        )

    def run_isolated(
        self,
        plan: StepPlan,
        params: Mapping[str, SamplingParams],
        banned: Mapping[str, frozenset[int]],
        histories: Mapping[str, RowHistory] | None = None,
    ) -> StepResult:
        """``run``; if the forward raises, runs each chunk alone so that only the request whose
        part raises fails (with its error's type only: its text may carry one tenant's values),
        and the others still advance. Rerunning is safe: a chunk writes the same keys/values to
        the same KV rows again."""
        try:
            return self.run(plan, params, banned, histories)
        except Exception:
            _log.exception("engine step of %d chunks failed; isolating", len(plan.chunks))
        merged = StepResult({}, {})
        for chunk in plan.chunks:
            rid = chunk.request_id
            mine = {rid: params[rid]} if rid in params else {}
            try:
                result = self.run(StepPlan((chunk,), ()), mine, banned, histories)
            except Exception as exc:
                _log.warning("request %s fails alone: %r", rid, exc)
                merged.failed[rid] = f"its part of the step raised {type(exc).__name__}"
                continue
            merged.sampled.update(result.sampled)
            merged.failed.update(result.failed)
            merged.logprobs.update(result.logprobs)
            merged.prompt_logprobs.update(result.prompt_logprobs)
            merged.request_faults.update(result.request_faults)
        return merged

    @property
    def vocab_size(self) -> int:
        """Width of the logits: token ids the sampler may index are below it."""
        return self.model.config.vocab_size

    def drop(self, request_id: str) -> None:
        """Forget a finished request's random stream and penalty counts."""
        self._generators.pop(request_id, None)
        self._penalties.pop(request_id, None)

    def _penalty_counts(
        self, ids: list[str], histories: Mapping[str, RowHistory]
    ) -> list[PenaltyCounts | None]:
        """The penalty counts of each sampling request with a history (None: no penalty),
        brought up to it from the counts its earlier steps left. Counts not read for
        ``PENALTY_COUNTS_IDLE_STEPS`` steps go (a preempted or paused request counts afresh
        when it samples again), so they are bounded by the requests that sample."""
        self._steps += 1
        vocab, device = self.vocab_size, self.model.device
        out: list[PenaltyCounts | None] = []
        for request_id in ids:
            history = histories.get(request_id)
            if history is None:
                out.append(None)
                continue
            kept = self._penalties.get(request_id)
            if kept is None:
                counts = PenaltyCounts.of(history, vocab, device)
            else:
                counts = kept[0].advance(history)
            self._penalties[request_id] = (counts, self._steps)
            out.append(counts)
        oldest = self._steps - PENALTY_COUNTS_IDLE_STEPS
        if any(step <= oldest for _, step in self._penalties.values()):
            self._penalties = {r: e for r, e in self._penalties.items() if e[1] > oldest}
        return out

    def stream_ids(self) -> frozenset[str]:
        """Requests whose random stream is kept (``EngineCore.check_integrity``: live ones)."""
        return frozenset(self._generators)

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator | None:
        if request_id not in self._generators:
            self._generators[request_id] = make_generator(params, self.model.device)
        return self._generators[request_id]


def by_slot(plan: StepPlan) -> StepPlan:
    """``plan`` with its chunks in slot order, base-only ones last (stable): each adapter's
    tokens are then one run, which the LoRA op computes in place, with no gather and scatter
    per module. Results are keyed by request, so the order of rows is free."""
    chunks = sorted(plan.chunks, key=lambda c: (c.slot is None, c.slot or 0))
    if all(a is b for a, b in zip(chunks, plan.chunks, strict=True)):
        return plan
    return replace(plan, chunks=tuple(chunks))


def _prompt_logprobs(
    plan: StepPlan, logits: torch.Tensor, ends: list[int], params: Mapping[str, SamplingParams]
) -> dict[str, PromptLogprobs]:
    """Logprobs of the prompt tokens that the full-logits chunks' positions predict (position
    p's logits score token p + 1), from the raw logits, as vLLM's prompt logprobs."""
    out: dict[str, PromptLogprobs] = {}
    for chunk, end in zip(plan.chunks, ends, strict=True):
        targets = chunk.logprob_targets
        if not targets:
            continue
        first = end - len(chunk.token_ids)
        num_top = params[chunk.request_id].prompt_logprobs or 0
        entries = token_logprobs(
            logits[first : first + len(targets)], targets, [num_top] * len(targets)
        )
        out[chunk.request_id] = PromptLogprobs(chunk.start_pos + 1, tuple(entries))
    return out
