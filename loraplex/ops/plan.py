"""Per-step metadata builders shared by the backends (run once per step, never per module); the
BATCHED strategy's are in ``ops/batched_plan.py``.

Everything that needs a host sync (which slots are active, where runs of equal slots start)
happens here, so ``apply`` only launches tensor ops.
"""

from __future__ import annotations

import torch

from loraplex.ops.base import ArenaLayout, LoraBatch, Segment, Strategy


def check_token_slots(token_slots: torch.Tensor, num_slots: int) -> None:
    """Token slots are a 1-D int64 tensor of values in ``[-1, num_slots)``."""
    if token_slots.dim() != 1 or token_slots.dtype != torch.int64:
        raise ValueError(
            f"token_slots has shape {tuple(token_slots.shape)} and dtype {token_slots.dtype}; "
            "expected a 1-D int64 tensor"
        )
    low, high = (int(token_slots.min()), int(token_slots.max())) if token_slots.numel() else (0, 0)
    if low < -1 or high >= num_slots:
        raise ValueError(f"token_slots holds values outside [-1, {num_slots}); expected slots")


def active_slots(token_slots: torch.Tensor, layout: ArenaLayout) -> list[int]:
    """Distinct slots used by some token that hold an adapter (empty slots act as base-only)."""
    used = torch.unique(token_slots).tolist()
    return [slot for slot in used if slot >= 0 and layout.slot_rows[slot] > 0]


def active_slot_tokens(token_slots: torch.Tensor, layout: ArenaLayout) -> dict[int, int]:
    """Like :func:`active_slots`, with each slot's number of tokens."""
    used, counts = torch.unique(token_slots, return_counts=True)
    return {
        slot: count
        for slot, count in zip(used.tolist(), counts.tolist(), strict=True)
        if slot >= 0 and layout.slot_rows[slot] > 0
    }


def bits_of(slots: list[int]) -> int:
    bits = 0
    for slot in slots:
        bits |= 1 << slot
    return bits


def active_tables(layout: ArenaLayout, active_bits: int) -> tuple[bool, ...]:
    return tuple(bool(bits & active_bits) for bits in layout.module_slot_bits)


def none_batch(token_slots: torch.Tensor) -> LoraBatch:
    return LoraBatch(token_slots, int(token_slots.numel()), Strategy.NONE, active_bits=0)


def segments_of(sorted_slots: torch.Tensor, active_bits: int) -> tuple[Segment, ...]:
    """Runs of equal slots in ``sorted_slots`` whose slot is active (base-only runs dropped)."""
    values, counts = torch.unique_consecutive(sorted_slots, return_counts=True)
    segments = []
    start = 0
    for slot, count in zip(values.tolist(), counts.tolist(), strict=True):
        if slot >= 0 and active_bits >> slot & 1:
            segments.append(Segment(start, start + count, slot))
        start += count
    return tuple(segments)


# Most tokens a 16-bit CPU step's LoRA pass multiplies in float32: the merged op's foreign
# tokens (all of them, or none), and per run of the unmerged ``auto`` op's grouped pass (its
# longer runs stay in the dtype). Measured per module on both presets, float32 halves the merged
# pass at 4 foreign tokens and loses from about 32 on the large preset's widths, where
# bfloat16's matmuls amortise their per-call cost (docs/modes.md, eleventh to thirteenth passes).
FLOAT32_MAX_TOKENS = 16


def half_on_cpu(layout: ArenaLayout) -> bool:
    """16-bit weights on a CPU, where a skinny matmul of that dtype costs about 20 us whatever
    its size (oneDNN's per-call cost on this project's Xeon) against 3-5 us for float32's."""
    scales = layout.row_scale
    return scales.device.type == "cpu" and scales.element_size() == 2


def runs_in_float32(num_tokens: int, layout: ArenaLayout, max_tokens: int) -> bool:
    """Whether a step whose LoRA pass covers ``num_tokens`` tokens runs it in float32: 16-bit
    weights on a CPU and at most ``max_tokens`` of them (the rule both torch ops share)."""
    return num_tokens <= max_tokens and half_on_cpu(layout)


def float32_slots(tokens: dict[int, int], max_run: int) -> list[int]:
    """The slots of ``tokens`` (active slot -> its tokens) whose run a float32 pass computes in
    float32: those of at most ``max_run`` tokens, when the step has two runs or more (one run's
    single pair is cheaper in the dtype than the pass's gather, conversions and copy back)."""
    if len(tokens) < 2:
        return []
    return [slot for slot, count in tokens.items() if count <= max_run]


def grouped_batch(token_slots: torch.Tensor, layout: ArenaLayout, slots: list[int]) -> LoraBatch:
    """Tokens grouped in runs per slot; sorted (stable) only when a slot's tokens are scattered."""
    bits = bits_of(slots)
    segments = segments_of(token_slots, bits)
    if len(segments) > len(slots):
        return gathered_batch(token_slots, layout, slots)
    return LoraBatch(
        token_slots,
        int(token_slots.numel()),
        Strategy.GROUPED,
        active_bits=bits,
        segments=segments,
        active_tables=active_tables(layout, bits),
    )


def gathered_batch(
    token_slots: torch.Tensor,
    layout: ArenaLayout,
    slots: list[int],
    *,
    float32: bool = False,
    dtype_runs: frozenset[int] = frozenset(),
) -> LoraBatch:
    """GROUPED over the adapter tokens gathered and sorted by slot (stable): one run per slot;
    ``float32``: the runs computed in float32 (:func:`runs_in_float32`, :func:`float32_slots`)
    but those of the slots in ``dtype_runs``, computed in the dtype and added in float32."""
    bits = bits_of(slots)
    # Keep only adapter tokens: base-only tokens never enter the grouped computation.
    wanted = torch.tensor(slots, dtype=torch.int64, device=token_slots.device)
    keep = torch.nonzero(torch.isin(token_slots, wanted)).flatten()
    order = keep[torch.argsort(token_slots[keep], stable=True)]
    return LoraBatch(
        token_slots,
        int(token_slots.numel()),
        Strategy.GROUPED,
        active_bits=bits,
        segments=segments_of(token_slots[order], bits),
        order=order,
        active_tables=active_tables(layout, bits),
        float32=float32,
        dtype_runs=dtype_runs,
    )


def float32_pass_batch(
    token_slots: torch.Tensor, layout: ArenaLayout, tokens: dict[int, int], max_run: int
) -> LoraBatch:
    """GROUPED through the float32 pass where it can run (:func:`float32_slots`: two runs or
    more, the runs of at most ``max_run`` tokens in float32, the others in the dtype); plain
    grouped where no run is short enough for it (a single run among them)."""
    slots = list(tokens)
    short = float32_slots(tokens, max_run)
    if not short:
        return grouped_batch(token_slots, layout, slots)
    dtype_runs = frozenset(tokens).difference(short)
    return gathered_batch(token_slots, layout, slots, float32=True, dtype_runs=dtype_runs)


def covered_rows(layout: ArenaLayout, slots: list[int]) -> tuple[int, int]:
    """``[row_lo, row_hi)``: the arena rows from the first to the last active slot's block
    (inactive slots in between are covered too)."""
    row_lo = min(layout.slot_starts[slot] for slot in slots)
    row_hi = max(layout.slot_starts[slot] + layout.slot_rows[slot] for slot in slots)
    return row_lo, row_hi


def masked_batch(token_slots: torch.Tensor, layout: ArenaLayout, slots: list[int]) -> LoraBatch:
    """One row range covering every active slot, and a per-module scaled token x row mask."""
    bits = bits_of(slots)
    row_lo, row_hi = covered_rows(layout, slots)
    owner = layout.row_owner[row_lo:row_hi]
    hits = (owner.unsqueeze(0) == token_slots.unsqueeze(1)) & (token_slots >= 0).unsqueeze(1)
    scales = layout.row_scale[:, row_lo:row_hi]
    mask = hits.to(scales.dtype).unsqueeze(0) * scales.unsqueeze(1)
    return LoraBatch(
        token_slots,
        int(token_slots.numel()),
        Strategy.MASKED,
        active_bits=bits,
        row_lo=row_lo,
        row_hi=row_hi,
        mask=mask,
        misses=~hits,
        active_tables=active_tables(layout, bits),
    )


def loop_batch(token_slots: torch.Tensor, layout: ArenaLayout, slots: list[int]) -> LoraBatch:
    """Reference metadata: one segment per active slot (positions found again in apply)."""
    bits = bits_of(slots)
    return LoraBatch(
        token_slots,
        int(token_slots.numel()),
        Strategy.LOOP,
        active_bits=bits,
        segments=tuple(Segment(0, 0, slot) for slot in sorted(slots)),
        active_tables=active_tables(layout, bits),
    )
