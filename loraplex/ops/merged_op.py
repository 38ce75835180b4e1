"""The batched LoRA op while one adapter is merged into the base weights (torch backends).

Every token not on the merged slot needs its own adapter's delta (none for base-only tokens)
minus the merged adapter's delta, which a one-slot negative copy holds (model/merge.py). Those
tokens are gathered once (``order``) and get both in one pass; the sum is scattered back once
(or, grouped, the own-adapter runs read ``x`` in place: below). The merged revision's tokens
are not gathered at all: they cost no LoRA work.

The pass over the gathered tokens is masked or grouped, chosen by :class:`AutoPolicy` on the
gathered tokens alone (a decode step with a few foreign tokens among many merged ones is
masked over those few; a prefill step grouped), or fixed by a ``masked``/``grouped`` backend.
Against the unmerged op that is at most the same launches plus the negative matmul pair, over
fewer tokens.

Grouped, when each slot's foreign tokens already lie in one run in the step's own order (a
decode step whose few foreign sequences are on distinct revisions; a prefill of one sequence
per revision), the own-adapter runs are added to ``out`` in place, as the unmerged grouped op
does for unscattered slots, and only the negative pass gathers: no zeroed buffer, no sorted
copy of ``x``. Measured on the small preset's 80 % decode step (docs/modes.md, sixth pass)
that form costs less than the gathered one; the LoRA work of a merged decode step is still
bound by the adapter rows it reads, which merging does not reduce while foreign tokens remain
(the negative copy has the merged adapter's rows).

In float32, on a CPU, when the weights are 16-bit and the foreign tokens few (``auto`` only, at
most ``FLOAT32_MAX_TOKENS``, plan.runs_in_float32; the unmerged ``auto`` op applies the cap
per run instead, plan.float32_slots): there a skinny bfloat16 matmul costs about 20 us whatever
its size (oneDNN's per-call cost on this project's Xeon) against 3-5 us for float32's, so the
gathered tokens, their own adapters' rows (converted per step: a few thousand elements a run)
and the negative copy (converted once per merge, its scale folded in: ``negative_float32``) are
multiplied in float32 and the sum is added to ``out``'s rows once, in float32, with one
rounding to the model dtype (torch_ops.apply_float32; docs/modes.md, "Eleventh pass").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loraplex.ops.base import ArenaLayout, LoraBatch, ModuleLoraWeights, Strategy
from loraplex.ops.plan import (
    FLOAT32_MAX_TOKENS,
    active_slot_tokens,
    active_tables,
    bits_of,
    masked_batch,
    none_batch,
    runs_in_float32,
    segments_of,
)
from loraplex.ops.policy import AutoPolicy, StepShape
from loraplex.ops.torch_ops import Float32Pair, add_runs, apply_float32

# Backends whose computations are plain torch ops: the negative pass can ride them.
FUSED_BACKENDS = frozenset({"auto", "grouped", "masked"})


@dataclass(frozen=True)
class FusedMergedBatch(LoraBatch):
    """A merged step's plan: ``foreign`` lists every token not on the merged slot (base-only
    ones too). With ``order`` set, it gathers them (``foreign`` reordered) and MASKED
    rows/mask or GROUPED segments index the gathered tokens; with ``order`` None, GROUPED
    segments index ``x`` itself (runs in place) and only the negative pass gathers."""

    foreign: torch.Tensor | None = None  # [num_foreign] int64 positions of the foreign tokens


def fused_plan(
    token_slots: torch.Tensor,
    merged_slot: int,
    layout: ArenaLayout,
    backend: str,
    policy: AutoPolicy | None = None,
    *,
    float32_max_tokens: int = FLOAT32_MAX_TOKENS,
) -> LoraBatch:
    """The step's plan (NONE when every token is the merged revision's); with ``auto``, 16-bit
    weights on a CPU and at most ``float32_max_tokens`` foreign tokens, the float32 pass."""
    if token_slots.device.type == "cpu" and all(s == merged_slot for s in token_slots.tolist()):
        # every token the merged revision's, checked on the host list: one cheap call where
        # the ne / nonzero pair below cost about three times as much right after a forward
        # (cold caches; docs/modes.md, tenth pass), a measurable share of a merged decode step
        return none_batch(token_slots)
    others = torch.nonzero(token_slots != merged_slot).flatten()
    if others.numel() == 0:
        return none_batch(token_slots)
    sub = token_slots[others]
    tokens = active_slot_tokens(sub, layout)
    slots = list(tokens)
    if backend == "auto" and runs_in_float32(len(sub), layout, float32_max_tokens):
        return _gathered_plan(token_slots, others, layout, slots, float32=True)
    if slots and backend != "grouped":
        shape = StepShape.of(len(sub), tokens, layout)
        if backend == "masked" or (policy or AutoPolicy()).masked(shape, layout.width):
            return _masked_plan(token_slots, others, layout, slots)
    return _grouped_plan(token_slots, merged_slot, others, layout, slots)


def _masked_plan(
    token_slots: torch.Tensor, others: torch.Tensor, layout: ArenaLayout, slots: list[int]
) -> FusedMergedBatch:
    plan = masked_batch(token_slots[others], layout, slots)
    return FusedMergedBatch(
        token_slots,
        int(token_slots.numel()),
        Strategy.MASKED,
        active_bits=plan.active_bits,
        order=others,
        row_lo=plan.row_lo,
        row_hi=plan.row_hi,
        mask=plan.mask,
        misses=plan.misses,
        active_tables=plan.active_tables,
        foreign=others,
    )


def _grouped_plan(
    token_slots: torch.Tensor,
    merged_slot: int,
    others: torch.Tensor,
    layout: ArenaLayout,
    slots: list[int],
) -> FusedMergedBatch:
    """Runs in place when each slot's foreign tokens are one run already, else gathered and
    sorted by slot."""
    bits = bits_of(slots)
    segments = segments_of(torch.where(token_slots == merged_slot, -1, token_slots), bits)
    if len(segments) > len(slots):
        return _gathered_plan(token_slots, others, layout, slots, float32=False)
    return FusedMergedBatch(
        token_slots,
        int(token_slots.numel()),
        Strategy.GROUPED,
        active_bits=bits,
        segments=segments,
        active_tables=active_tables(layout, bits),
        foreign=others,
    )


def _gathered_plan(
    token_slots: torch.Tensor,
    others: torch.Tensor,
    layout: ArenaLayout,
    slots: list[int],
    *,
    float32: bool,
) -> FusedMergedBatch:
    """The foreign tokens gathered and sorted by slot (one run per slot)."""
    bits = bits_of(slots)
    order = others[torch.argsort(token_slots[others], stable=True)]
    return FusedMergedBatch(
        token_slots,
        int(token_slots.numel()),
        Strategy.GROUPED,
        active_bits=bits,
        segments=segments_of(token_slots[order], bits),
        order=order,
        active_tables=active_tables(layout, bits),
        foreign=order,
        float32=float32,
    )


def negative_float32(negative: ModuleLoraWeights) -> Float32Pair | None:
    """The negative copy's ``(A.T, scale * B^T)`` in float32; None where it has no rows."""
    merged = negative.slots[0]
    if merged.rank == 0:
        return None
    lora_a_t, lora_b_t = negative.pair(merged)
    return lora_a_t.float(), lora_b_t.float().mul_(merged.scale)


def apply_fused(
    x: torch.Tensor,
    out: torch.Tensor,
    weights: ModuleLoraWeights,
    negative: ModuleLoraWeights,
    batch: FusedMergedBatch,
    *,
    negative32: Float32Pair | None = None,
) -> torch.Tensor:
    """``out[t] += delta_{slot(t)}(x[t]) - delta_merged(x[t])`` for every foreign token.
    ``negative32``: :func:`negative_float32` of ``negative``, kept by the caller (a float32
    plan converts it here when None)."""
    order, foreign = batch.order, batch.foreign
    if foreign is None:
        raise ValueError(
            "a fused merged batch needs its foreign tokens; expected fused_plan output"
        )
    own = batch.active_tables[weights.table_index]
    merged = negative.slots[0]
    if not own and merged.rank == 0:  # neither side targets this module
        return out
    if order is None:
        return _apply_in_place(x, out, weights, negative, batch)
    if batch.float32:
        pair = negative32 if negative32 is not None else negative_float32(negative)
        return apply_float32(x, out, weights, batch, pair)
    source = x.index_select(0, order)
    if batch.strategy is Strategy.MASKED and own:
        if batch.mask is None or batch.misses is None:
            raise ValueError("a masked fused batch needs its mask; expected fused_plan output")
        hidden = torch.mm(source, weights.lora_a[batch.row_lo : batch.row_hi].T)
        hidden.mul_(batch.mask[weights.table_index])
        hidden.masked_fill_(batch.misses, 0.0)  # see apply_masked: inf * 0 must not leak
        target = torch.mm(hidden, weights.lora_b[batch.row_lo : batch.row_hi])
    else:
        target = out.new_zeros((order.numel(), out.shape[1]))
        if own:
            add_runs(source, target, weights, batch.segments)
    if merged.rank:
        lora_a_t, lora_b_t = negative.pair(merged)
        target.addmm_(torch.mm(source, lora_a_t), lora_b_t, alpha=merged.scale)
    return out.index_add_(0, order, target)


def _apply_in_place(
    x: torch.Tensor,
    out: torch.Tensor,
    weights: ModuleLoraWeights,
    negative: ModuleLoraWeights,
    batch: FusedMergedBatch,
) -> torch.Tensor:
    """GROUPED runs indexing ``x`` itself, then the negative pass over the gathered foreign
    tokens."""
    if batch.active_tables[weights.table_index]:
        add_runs(x, out, weights, batch.segments)
    merged, foreign = negative.slots[0], batch.foreign
    if merged.rank and foreign is not None:
        lora_a_t, lora_b_t = negative.pair(merged)
        delta = torch.mm(torch.mm(x.index_select(0, foreign), lora_a_t), lora_b_t)
        out.index_add_(0, foreign, delta, alpha=merged.scale)
    return out
