"""Per-step metadata builders shared by the backends (run once per step, never per module).

Everything that needs a host sync (which slots are active, where runs of equal slots start)
happens here, so ``apply`` only launches tensor ops.
"""

from __future__ import annotations

import torch

from loraplex.ops.base import (
    ArenaLayout,
    BlockGroup,
    BlockPlan,
    BlockSet,
    LoraBatch,
    Segment,
    Strategy,
)


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


def block_grid(layout: ArenaLayout, slots: list[int]) -> tuple[int, int, int] | None:
    """``(row_lo, num_blocks, block_rows)`` when every slot in ``slots`` reserves the same rows
    and starts on one grid of that many rows, so their row range is equal blocks; else None."""
    block_rows = layout.slot_rows[slots[0]]
    starts = [layout.slot_starts[slot] for slot in slots]
    row_lo = min(starts)
    if any(layout.slot_rows[s] != block_rows for s in slots) or any(
        (start - row_lo) % block_rows for start in starts
    ):
        return None
    return row_lo, (max(starts) - row_lo) // block_rows + 1, block_rows


def batched_batch(
    token_slots: torch.Tensor, layout: ArenaLayout, tokens: dict[int, int]
) -> LoraBatch:
    """Every adapter token placed in its slot's block (``tokens``: active slot -> its tokens;
    the slots must be on one grid, :func:`block_grid`)."""
    slots = list(tokens)
    grid = block_grid(layout, slots)
    if grid is None:
        raise ValueError(f"slots {slots} do not share one row grid; expected block_grid's slots")
    row_lo, num_blocks, block_rows = grid
    per_block = max(tokens.values())
    block_of = [-1] * len(layout.slot_rows)
    for slot in slots:
        block_of[slot] = (layout.slot_starts[slot] - row_lo) // block_rows
    keep, positions = block_positions(token_slots, block_of, per_block)
    in_order = torch.arange(keep.numel(), device=keep.device)
    direct = num_blocks * per_block == keep.numel() and bool(
        torch.equal(keep, in_order) and torch.equal(positions, in_order)
    )
    scales = layout.row_scale[:, row_lo : row_lo + num_blocks * block_rows : block_rows]
    active = scales[:, sorted({block_of[slot] for slot in slots})].tolist()
    plan = BlockPlan(
        row_lo,
        num_blocks,
        block_rows,
        per_block,
        scales.reshape(*scales.shape, 1, 1),
        tuple(common_scale(row) for row in active),
        None if direct else keep,
        None if direct else positions,
    )
    return batched_of(token_slots, layout, slots, grid=plan)


def batched_of(
    token_slots: torch.Tensor,
    layout: ArenaLayout,
    slots: list[int],
    grid: BlockPlan | None = None,
    classes: BlockSet | None = None,
) -> LoraBatch:
    bits = bits_of(slots)
    return LoraBatch(
        token_slots,
        int(token_slots.numel()),
        Strategy.BATCHED,
        active_bits=bits,
        active_tables=active_tables(layout, bits),
        grid=grid,
        classes=classes,
    )


def block_positions(
    token_slots: torch.Tensor, block_of: list[int], per_block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The adapter tokens (``block_of[slot] >= 0``) and each one's row in the padded input:
    its block x ``per_block`` + how many tokens of its block come before it."""
    device = token_slots.device
    blocks = torch.tensor(block_of, dtype=torch.int64, device=device)[token_slots.clamp(min=0)]
    blocks[token_slots < 0] = -1
    keep = torch.nonzero(blocks >= 0).flatten()
    kept = blocks[keep]
    by_block = torch.argsort(kept, stable=True)
    sorted_blocks = kept[by_block]
    place = torch.empty_like(kept)
    place[by_block] = torch.arange(kept.numel(), device=device) - torch.searchsorted(
        sorted_blocks, sorted_blocks
    )
    return keep, kept * per_block + place


def common_scale(scales: list[float]) -> float | None:
    """The one non-zero scale among ``scales``, if they have one (0.0 when all are zero).
    A zero scale is a slot without this module: its rows are zero, so any alpha suits it."""
    nonzero = {scale for scale in scales if scale != 0.0}
    if len(nonzero) > 1:
        return None
    return nonzero.pop() if nonzero else 0.0


def rank_classes(layout: ArenaLayout, slots: list[int]) -> list[tuple[int, int, int, list[int]]]:
    """``slots`` cut into groups one batched matmul can read in place: ``(row_lo, row_stride,
    block_rows, slots)``, the slots of a group reserving ``block_rows`` rows each at starts
    ``row_lo + i * row_stride`` (arena order). Per rank class, its slots in arena order are cut
    into maximal runs of equal start-to-start distance (a packed arena loaded round-robin over a
    few ranks puts each class at one stride)."""
    by_rows: dict[int, list[int]] = {}
    for slot in slots:
        by_rows.setdefault(layout.slot_rows[slot], []).append(slot)
    groups: list[tuple[int, int, int, list[int]]] = []
    for rows, members in sorted(by_rows.items()):
        members.sort(key=lambda slot: layout.slot_starts[slot])
        run = [members[0]]
        for slot in members[1:]:
            first = layout.slot_starts[run[0]]
            stride = layout.slot_starts[run[1]] - first if len(run) > 1 else 0
            if len(run) == 1 or layout.slot_starts[slot] - layout.slot_starts[run[-1]] == stride:
                run.append(slot)
                continue
            groups.append(class_group(layout, rows, run))
            run = [slot]
        groups.append(class_group(layout, rows, run))
    return groups


def class_group(layout: ArenaLayout, rows: int, run: list[int]) -> tuple[int, int, int, list[int]]:
    starts = [layout.slot_starts[slot] for slot in run]
    stride = starts[1] - starts[0] if len(run) > 1 else rows
    return starts[0], stride, rows, run


def blocked_batch(
    token_slots: torch.Tensor, layout: ArenaLayout, tokens: dict[int, int]
) -> LoraBatch:
    """Every adapter token placed in its slot's block of its rank class (``tokens``: active
    slot -> its tokens); see :class:`~loraplex.ops.base.BlockSet`. Built on the host: a few
    list operations per token cost less than a dozen tiny tensor ops at decode sizes."""
    positions: dict[int, list[int]] = {slot: [] for slot in tokens}
    for position, slot in enumerate(token_slots.tolist()):
        if slot in positions:
            positions[slot].append(position)
    groups: list[BlockGroup] = []
    padded: list[int] = []  # per padded row: the token it reads (padding: its block's first)
    starts: list[int] = []  # per padded row: its slot's first arena row
    real: list[float] = []  # per padded row: 1.0, or 0.0 for padding
    for row_lo, stride, rows, run in rank_classes(layout, list(tokens)):
        most = max(tokens[slot] for slot in run)
        groups.append(BlockGroup(row_lo, stride, len(run), rows, most, len(padded)))
        for slot in run:
            own = positions[slot]
            padding = most - len(own)
            padded += own + [own[0]] * padding
            starts += [layout.slot_starts[slot]] * most
            real += [1.0] * len(own) + [0.0] * padding
    device = token_slots.device
    scales = layout.row_scale[:, torch.tensor(starts, dtype=torch.int64, device=device)]
    exact = len(padded) == sum(tokens.values())
    if not exact:
        scales = scales * torch.tensor(real, dtype=scales.dtype, device=device)
    rows_of = layout.row_scale[:, [layout.slot_starts[slot] for slot in tokens]].tolist()
    blocks = BlockSet(
        tuple(groups),
        len(padded),
        torch.tensor(padded, dtype=torch.int64, device=device),
        scales.unsqueeze(2),
        tuple(common_scale(row) if exact else None for row in rows_of),
    )
    return batched_of(token_slots, layout, list(tokens), classes=blocks)
