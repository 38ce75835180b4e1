"""Fast torch backends (CPU, and CUDA through the same tensor ops).

- ``masked``: one matmul of the tokens against every active adapter's A rows (packed
  rank-exact, so no padding to the maximum rank), a per-token scaled 0/1 mask, one matmul
  against the B rows. Three ops per module whatever the number of adapters; wasted work grows
  with ``num_tokens x active rows``, so it suits decode.
- ``grouped``: tokens grouped by slot (stable sort only when scattered); one A/B matmul pair per
  group at the module's exact rank. Work is exact; each group costs two op launches, so it suits
  prefill (few long runs).
- ``batched``: when every active slot reserves the same rows on one row grid (one rank served,
  the usual case), their row range viewed as equal blocks: one batched A matmul and one batched
  B matmul for every slot at once, exact rank, each token against its own block only (tokens
  padded per block, gathered only when not already in block order). Otherwise (several
  ranks) one such pair per rank class: a class's slots, in arena order, lie at one stride
  (cut into runs that do), which a strided view reads in place; every adapter token is
  gathered once into a padded input and added back with one ``index_add_``.
- ``auto``: picks one of them per step from the step's shape (see
  :class:`~loraplex.ops.policy.AutoPolicy`); on a CPU with 16-bit weights, a grouped step of
  two runs or more whose runs of at most ``FLOAT32_MAX_TOKENS`` tokens (a decode sequence's
  adapter, a small prompt's) make the float32 pass cheaper in the policy's costs has its
  adapter tokens gathered, each short run's rows converted and computed in float32, the longer
  runs in the dtype, and the sum rounded once (``apply_float32``), as the merged op's foreign
  tokens are (ops/merged_op.py), because a skinny matmul in bfloat16 / float16 costs about
  15-20 us a call there against 3-5 us in float32 (docs/modes.md, eleventh to thirteenth
  passes).
"""

from __future__ import annotations

import torch

from loraplex.ops.base import (
    ArenaLayout,
    BlockSet,
    LoraBatch,
    ModuleLoraWeights,
    Segment,
    Strategy,
)
from loraplex.ops.batched_plan import batched_batch, blocked_batch
from loraplex.ops.plan import (
    FLOAT32_MAX_TOKENS,
    active_slot_tokens,
    active_slots,
    check_token_slots,
    float32_pass_batch,
    grouped_batch,
    masked_batch,
    none_batch,
)
from loraplex.ops.policy import AutoPolicy, StepShape

Float32Pair = tuple[torch.Tensor, torch.Tensor]  # (A.T, scale * B^T) in float32


def apply_masked(
    x: torch.Tensor, out: torch.Tensor, weights: ModuleLoraWeights, batch: LoraBatch
) -> torch.Tensor:
    if batch.mask is None or batch.misses is None:
        raise ValueError("batch strategy MASKED requires a mask; expected masked_batch output")
    lora_a = weights.lora_a[batch.row_lo : batch.row_hi]
    lora_b_t = weights.lora_b[batch.row_lo : batch.row_hi]
    hidden = torch.mm(x, lora_a.T)
    hidden.mul_(batch.mask[weights.table_index])
    # NOTE: a zero scale cannot hide another adapter's overflow (inf * 0 is NaN): zero the rows
    # a token does not use, so huge weights of one adapter never reach other requests' tokens.
    hidden.masked_fill_(batch.misses, 0.0)
    return out.addmm_(hidden, lora_b_t)


def add_runs(
    source: torch.Tensor,
    target: torch.Tensor,
    weights: ModuleLoraWeights,
    segments: tuple[Segment, ...],
) -> None:
    """``target[run] += scale * source[run] @ A.T @ B^T`` for each run of equal slots."""
    for segment in segments:
        rows = weights.slots[segment.slot]
        if rows.rank == 0:
            continue
        lora_a_t, lora_b_t = weights.pair(rows)
        hidden = torch.mm(source[segment.start : segment.end], lora_a_t)
        target[segment.start : segment.end].addmm_(hidden, lora_b_t, alpha=rows.scale)


def apply_grouped(
    x: torch.Tensor, out: torch.Tensor, weights: ModuleLoraWeights, batch: LoraBatch
) -> torch.Tensor:
    if batch.float32:
        return apply_float32(x, out, weights, batch)
    order = batch.order
    source = x if order is None else x.index_select(0, order)
    target = out if order is None else out.new_zeros((order.numel(), out.shape[1]))
    add_runs(source, target, weights, batch.segments)
    if order is not None:
        out.index_add_(0, order, target)
    return out


def apply_float32(
    x: torch.Tensor,
    out: torch.Tensor,
    weights: ModuleLoraWeights,
    batch: LoraBatch,
    every: Float32Pair | None = None,
) -> torch.Tensor:
    """A gathered GROUPED batch's runs in float32: the gathered tokens and each run's rows
    converted (rank x (d_in + d_out) elements a run), the delta summed with ``out``'s rows in
    float32 and rounded once to ``out``'s dtype (``order`` holds each token once, so the rows
    are copied back, not accumulated). ``every``: a float32 pair, its scale folded in, added for
    every gathered token first (the merged op's negative copy)."""
    order = batch.order
    if order is None:
        raise ValueError("a float32 batch needs its gathered tokens; expected gathered_batch")
    gathered = x.index_select(0, order)
    source = gathered.float()
    if every is not None:
        target = torch.mm(torch.mm(source, every[0]), every[1])
    else:
        target = source.new_zeros((order.numel(), out.shape[1]))
    if batch.active_tables[weights.table_index]:
        for segment in batch.segments:
            rows = weights.slots[segment.slot]
            if rows.rank == 0:
                continue
            lora_a_t, lora_b_t = weights.pair(rows)
            run = target[segment.start : segment.end]
            if segment.slot in batch.dtype_runs:  # a long run: its matmuls in the dtype
                hidden = torch.mm(gathered[segment.start : segment.end], lora_a_t)
                run.add_(torch.mm(hidden, lora_b_t), alpha=rows.scale)
                continue
            hidden = torch.mm(source[segment.start : segment.end], lora_a_t.float())
            run.addmm_(hidden, lora_b_t.float(), alpha=rows.scale)
    target.add_(out.index_select(0, order))
    return out.index_copy_(0, order, target.to(out.dtype))


def apply_batched(
    x: torch.Tensor, out: torch.Tensor, weights: ModuleLoraWeights, batch: LoraBatch
) -> torch.Tensor:
    plan = batch.grid
    if plan is None:
        if batch.classes is not None:
            return apply_blocks(x, out, weights, batch.classes)
        raise ValueError("batch strategy BATCHED requires a grid or classes; expected its plan")
    lora_a_t, lora_b_t = weights.blocks(plan)
    shape = (plan.num_blocks, plan.tokens_per_block)
    count = plan.num_blocks * plan.tokens_per_block
    tokens, positions = plan.tokens, plan.positions
    if tokens is None or positions is None:  # x's first rows are the blocks' rows, in order
        source = x[:count].reshape(*shape, x.shape[1])
    else:  # NOTE: padding rows stay zero; what other blocks give them is never read back
        gathered = x.index_select(0, tokens)
        padded = x.new_zeros((count, x.shape[1])).index_copy_(0, positions, gathered)
        source = padded.view(*shape, x.shape[1])
    hidden = torch.bmm(source, lora_a_t)  # [blocks, tokens_per_block, block_rows]
    alpha = plan.alphas[weights.table_index]
    if alpha is None:
        hidden.mul_(plan.scales[weights.table_index])
        alpha = 1.0
    if tokens is None or positions is None:
        out[:count].view(*shape, out.shape[1]).baddbmm_(hidden, lora_b_t, alpha=alpha)
        return out
    delta = torch.bmm(hidden, lora_b_t).view(count, out.shape[1])
    return out.index_add_(0, tokens, delta.index_select(0, positions), alpha=alpha)


def apply_blocks(
    x: torch.Tensor, out: torch.Tensor, weights: ModuleLoraWeights, blocks: BlockSet
) -> torch.Tensor:
    """One batched matmul pair per rank class over its strided row blocks, on the gathered
    padded input, added back with one ``index_add_``."""
    source = x.index_select(0, blocks.tokens)
    delta = out.new_empty((blocks.rows, out.shape[1]))
    alpha = blocks.alphas[weights.table_index]
    scales = blocks.scales[weights.table_index]
    for group in blocks.groups:
        lora_a_t, lora_b_t = weights.strided(group)
        span = slice(group.offset, group.offset + group.num_blocks * group.tokens_per_block)
        shape = (group.num_blocks, group.tokens_per_block)
        hidden = torch.bmm(source[span].view(*shape, x.shape[1]), lora_a_t)
        if alpha is None:  # NOTE: padding rows get scale 0 (they repeat a token of their block)
            hidden.mul_(scales[span].view(*shape, 1))
        torch.bmm(hidden, lora_b_t, out=delta[span].view(*shape, out.shape[1]))
    return out.index_add_(0, blocks.tokens, delta, alpha=1.0 if alpha is None else alpha)


def apply_batch(
    x: torch.Tensor, out: torch.Tensor, weights: ModuleLoraWeights, batch: LoraBatch
) -> torch.Tensor:
    """Run whichever computation ``prepare`` chose for this step."""
    if batch.strategy is Strategy.NONE or not batch.active_tables[weights.table_index]:
        return out
    if batch.strategy is Strategy.MASKED:
        return apply_masked(x, out, weights, batch)
    if batch.strategy is Strategy.GROUPED:
        return apply_grouped(x, out, weights, batch)
    if batch.strategy is Strategy.BATCHED:
        return apply_batched(x, out, weights, batch)
    raise ValueError(f"batch strategy {batch.strategy} is not run by torch backends")


class MaskedBackend:
    """Always the masked computation (decode-shaped steps)."""

    name = "masked"

    def prepare(self, token_slots: torch.Tensor, layout: ArenaLayout) -> LoraBatch:
        check_token_slots(token_slots, len(layout.slot_rows))
        slots = active_slots(token_slots, layout)
        return masked_batch(token_slots, layout, slots) if slots else none_batch(token_slots)

    def apply(
        self, x: torch.Tensor, out: torch.Tensor, weights: ModuleLoraWeights, batch: LoraBatch
    ) -> torch.Tensor:
        return apply_batch(x, out, weights, batch)


class GroupedBackend:
    """Always the grouped computation (prefill-shaped steps)."""

    name = "grouped"

    def prepare(self, token_slots: torch.Tensor, layout: ArenaLayout) -> LoraBatch:
        check_token_slots(token_slots, len(layout.slot_rows))
        slots = active_slots(token_slots, layout)
        return grouped_batch(token_slots, layout, slots) if slots else none_batch(token_slots)

    def apply(
        self, x: torch.Tensor, out: torch.Tensor, weights: ModuleLoraWeights, batch: LoraBatch
    ) -> torch.Tensor:
        return apply_batch(x, out, weights, batch)


def batched_or_blocked(
    token_slots: torch.Tensor,
    layout: ArenaLayout,
    tokens: dict[int, int],
    shape: StepShape | None = None,
) -> LoraBatch:
    """The batched plan: one grid when the active slots share one (``batch.grid``), else one
    group of blocks per rank class (``batch.classes``)."""
    shape = shape or StepShape.of(int(token_slots.numel()), tokens, layout)
    if shape.block_groups:
        return blocked_batch(token_slots, layout, tokens)
    return batched_batch(token_slots, layout, tokens)


class BatchedBackend:
    """Always the batched computation: over one row grid when the active slots share one, else
    one batched matmul pair per rank class (``LoraBatch.grid`` / ``classes`` say which)."""

    name = "batched"

    def prepare(self, token_slots: torch.Tensor, layout: ArenaLayout) -> LoraBatch:
        check_token_slots(token_slots, len(layout.slot_rows))
        tokens = active_slot_tokens(token_slots, layout)
        if not tokens:
            return none_batch(token_slots)
        return batched_or_blocked(token_slots, layout, tokens)

    def apply(
        self, x: torch.Tensor, out: torch.Tensor, weights: ModuleLoraWeights, batch: LoraBatch
    ) -> torch.Tensor:
        return apply_batch(x, out, weights, batch)


class AutoBackend:
    """The cheapest computation for each step's shape (:class:`AutoPolicy`): batched for
    decode steps over many slots with float32 weights on a CPU (one matmul pair over the slots
    on one row grid, else one per rank class), masked where launches or 16-bit skinny matmuls
    cost more than its wasted rows (a GPU; 16-bit weights on a CPU), grouped for long runs and
    a single run; on a CPU with 16-bit weights, a grouped step of two runs or more goes through the
    float32 pass (its runs of at most ``float32_max_tokens`` tokens in float32, longer ones in
    the dtype; 0: never) where :meth:`AutoPolicy.grouped_in_float32` finds it cheaper. With
    bfloat16 weights on a CPU without native bfloat16 arithmetic (``bfloat16_emulated``; None:
    this CPU's /proc/cpuinfo), masked's wide matmuls are what cost, and decode steps go grouped
    (mostly through the float32 pass) instead; without AMX's tiles (``matrix_tiles``; None:
    this CPU's) they get no faster rate than grouped's."""

    name = "auto"

    def __init__(
        self,
        policy: AutoPolicy | None = None,
        float32_max_tokens: int = FLOAT32_MAX_TOKENS,
        bfloat16_emulated: bool | None = None,
        matrix_tiles: bool | None = None,
    ) -> None:
        if float32_max_tokens < 0:
            raise ValueError(f"float32_max_tokens {float32_max_tokens} is invalid; expected >= 0")
        self.policy = policy or AutoPolicy()
        self.float32_max_tokens = float32_max_tokens
        self.bfloat16_emulated = bfloat16_emulated
        self.matrix_tiles = matrix_tiles

    def prepare(self, token_slots: torch.Tensor, layout: ArenaLayout) -> LoraBatch:
        check_token_slots(token_slots, len(layout.slot_rows))
        tokens = active_slot_tokens(token_slots, layout)
        slots = list(tokens)
        if not slots:
            return none_batch(token_slots)
        shape = StepShape.of(
            int(token_slots.numel()),
            tokens,
            layout,
            self.float32_max_tokens,
            self.bfloat16_emulated,
            matrix_tiles=self.matrix_tiles,
        )
        strategy = self.policy.choose(shape, layout.width)
        if strategy is Strategy.MASKED:
            return masked_batch(token_slots, layout, slots)
        if strategy is Strategy.BATCHED:
            return batched_or_blocked(token_slots, layout, tokens, shape)
        if self.policy.grouped_in_float32(shape, layout.width):
            return float32_pass_batch(token_slots, layout, tokens, self.float32_max_tokens)
        return grouped_batch(token_slots, layout, slots)

    def apply(
        self, x: torch.Tensor, out: torch.Tensor, weights: ModuleLoraWeights, batch: LoraBatch
    ) -> torch.Tensor:
        return apply_batch(x, out, weights, batch)
