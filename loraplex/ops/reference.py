"""Reference backend: a loop over active adapters with PEFT's expression (dropout off).

Slow by design (one gather, two matmuls and a scatter per active adapter per module); it is
the ground truth the fast backends are tested against and the "per-adapter loop" baseline in
the execution benchmark.
"""

from __future__ import annotations

import torch

from loraplex.ops.base import ArenaLayout, LoraBatch, ModuleLoraWeights, Strategy
from loraplex.ops.plan import active_slots, check_token_slots, loop_batch, none_batch


class ReferenceBackend:
    """Per active slot: ``out[idx] += ((x[idx] @ A.T) @ B.T) * scale`` exactly as PEFT orders it."""

    name = "reference"

    def prepare(self, token_slots: torch.Tensor, layout: ArenaLayout) -> LoraBatch:
        check_token_slots(token_slots, len(layout.slot_rows))
        slots = active_slots(token_slots, layout)
        return loop_batch(token_slots, layout, slots) if slots else none_batch(token_slots)

    def apply(
        self, x: torch.Tensor, out: torch.Tensor, weights: ModuleLoraWeights, batch: LoraBatch
    ) -> torch.Tensor:
        if batch.strategy is Strategy.NONE or not batch.active_tables[weights.table_index]:
            return out
        for segment in batch.segments:
            rows = weights.slots[segment.slot]
            if rows.rank == 0:
                continue
            lora_a = weights.lora_a[rows.start : rows.start + rows.rank]  # [rank, d_in]
            lora_b_t = weights.lora_b[rows.start : rows.start + rows.rank]  # [rank, d_out]
            index = torch.nonzero(batch.token_slots == segment.slot).flatten()
            delta = (x.index_select(0, index) @ lora_a.T) @ lora_b_t * rows.scale
            out.index_add_(0, index, delta)
        return out
