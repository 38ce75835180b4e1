"""The BATCHED strategy's per-step metadata: adapter tokens placed in their slot's block, one
batched matmul per row grid (``batched_batch``) or per rank class (``blocked_batch``).

Split from ``ops/plan.py`` (the other strategies' builders and the shared helpers it imports):
this is the one strategy whose plan is about the arena's row grid rather than the tokens.
"""

from __future__ import annotations

import torch

from loraplex.ops.base import ArenaLayout, BlockGroup, BlockPlan, BlockSet, LoraBatch, Strategy
from loraplex.ops.plan import active_tables, bits_of


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
