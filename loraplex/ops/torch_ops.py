"""Fast torch backends (CPU, and CUDA through the same tensor ops).

- ``masked``: one matmul of the tokens against every active adapter's A rows (packed
  rank-exact, so no padding to the maximum rank), a per-token scaled 0/1 mask, one matmul
  against the B rows. Three ops per module whatever the number of adapters; wasted work grows
  with ``num_tokens x active rows``, so it suits decode.
- ``grouped``: tokens grouped by slot (stable sort only when scattered); one A/B matmul pair per
  group at the module's exact rank. Work is exact; each group costs two op launches, so it suits
  prefill (few long runs).
- ``auto``: picks one of the two per step from the step's shape (see :class:`AutoPolicy`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loraplex.ops.base import ArenaLayout, LoraBatch, ModuleLoraWeights, Segment, Strategy
from loraplex.ops.plan import (
    active_slot_tokens,
    active_slots,
    check_token_slots,
    covered_rows,
    grouped_batch,
    masked_batch,
    none_batch,
)


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
    order = batch.order
    source = x if order is None else x.index_select(0, order)
    target = out if order is None else out.new_zeros((order.numel(), out.shape[1]))
    add_runs(source, target, weights, batch.segments)
    if order is not None:
        out.index_add_(0, order, target)
    return out


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


@dataclass(frozen=True)
class AutoPolicy:
    """When the masked computation beats the grouped one (measured; docs/benchmarks/execution.md).

    Masked multiplies every token by every covered row (``num_tokens x covered rows`` per unit of
    module width) and reads every covered row's weights, active or not, in four launches;
    grouped does the exact ``sum(tokens x rank)`` and reads only the active slots' rows, in about
    two launches per run of equal slots (plus a gather and a scatter when scattered). Masked is
    picked when what it wastes, weighted by the pool's width (``ArenaLayout.width``), costs less
    than the launches it saves. Costs are in multiply-adds: a launch ``launch_macs``, a weight
    element read ``read_macs`` (decode-sized steps are bound by reading the weights).
    """

    # Measured on the project's 2-core Xeon (float32, one thread): a small op launch ~5 us
    # against ~40 G multiply-adds/s in these skinny matmuls, and a skinny matmul over few tokens
    # runs at the speed of reading its weights (~16 multiply-adds per element read). They put
    # the small preset's 16-adapter decode batch on masked, and its 80 %-one-adapter batches
    # (4 foreign tokens among 20) and every large-preset batch on grouped, as measured.
    launch_macs: int = 196608
    read_macs: int = 16
    min_runs_for_masked: int = 2  # a single run is always grouped (it is already exact)

    def __post_init__(self) -> None:
        for name in ("launch_macs", "read_macs"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 0")
        if self.min_runs_for_masked < 1:
            raise ValueError(
                f"min_runs_for_masked {self.min_runs_for_masked} is invalid; expected >= 1"
            )

    def masked(self, shape: StepShape, width: int) -> bool:
        """Whether a step of ``shape`` over modules ``width`` wide is cheaper masked."""
        if shape.runs < self.min_runs_for_masked:
            return False
        wasted_cells = shape.num_tokens * shape.covered_rows - shape.exact_cells
        wasted_reads = shape.covered_rows - shape.active_rows
        wasted = (wasted_cells + self.read_macs * wasted_reads) * max(width, 1)
        return wasted <= self.launch_macs * (2 * shape.runs - 1)


@dataclass(frozen=True)
class StepShape:
    """What :class:`AutoPolicy` weighs, per unit of module width."""

    num_tokens: int  # tokens the op sees
    runs: int  # active slots (grouped: one run each once sorted)
    covered_rows: int  # masked: rows from the first to the last active slot's block
    active_rows: int  # rows the active slots own
    exact_cells: int  # sum over active slots of tokens x rows

    @classmethod
    def of(cls, num_tokens: int, tokens: dict[int, int], layout: ArenaLayout) -> StepShape:
        """``tokens``: active slot -> its tokens (plan.active_slot_tokens)."""
        row_lo, row_hi = covered_rows(layout, list(tokens))
        return cls(
            num_tokens,
            len(tokens),
            row_hi - row_lo,
            sum(layout.slot_rows[slot] for slot in tokens),
            sum(count * layout.slot_rows[slot] for slot, count in tokens.items()),
        )


class AutoBackend:
    """Masked for launch-bound steps (many runs, few tokens, narrow modules), grouped otherwise,
    per :class:`AutoPolicy`."""

    name = "auto"

    def __init__(self, policy: AutoPolicy | None = None) -> None:
        self.policy = policy or AutoPolicy()

    def prepare(self, token_slots: torch.Tensor, layout: ArenaLayout) -> LoraBatch:
        check_token_slots(token_slots, len(layout.slot_rows))
        tokens = active_slot_tokens(token_slots, layout)
        slots = list(tokens)
        if not slots:
            return none_batch(token_slots)
        shape = StepShape.of(int(token_slots.numel()), tokens, layout)
        if self.policy.masked(shape, layout.width):
            return masked_batch(token_slots, layout, slots)
        return grouped_batch(token_slots, layout, slots)

    def apply(
        self, x: torch.Tensor, out: torch.Tensor, weights: ModuleLoraWeights, batch: LoraBatch
    ) -> torch.Tensor:
        return apply_batch(x, out, weights, batch)
