"""``LoraSlotPool.check_integrity``: the pool's invariants, checked from its public views."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from loraplex.model.lora import LoraSlotPool


def check_pool_integrity(pool: LoraSlotPool) -> None:
    """Ranges never overlap, ``row_owner`` matches them, rows outside every live (slot, module)
    range are zero, and scales sit exactly on live rows. Raises RuntimeError when broken."""
    layout = pool.layout
    owner = torch.full_like(layout.row_owner, -1)
    for slot in pool.occupied_slots():
        info = pool.slot_info(slot)
        if info is None:
            continue
        rows = slice(info.start, info.start + info.num_rows)
        if bool((owner[rows] != -1).any()):
            raise RuntimeError(f"slot {slot}: rows {info.start}+{info.num_rows} overlap a slot")
        owner[rows] = slot
    if not torch.equal(owner, layout.row_owner):
        raise RuntimeError("row_owner disagrees with the slots' row ranges")
    for layer in range(pool.spec.num_layers):
        for module in pool.target_modules:
            _check_table(pool, layer, module)


def _check_table(pool: LoraSlotPool, layer: int, module: str) -> None:
    view = pool.module_weights(layer, module)
    layout = pool.layout
    live = torch.zeros(pool.capacity_rows, dtype=torch.bool, device=pool.device)
    for slot, rows in enumerate(view.slots):
        if rows.rank == 0:
            continue
        live[rows.start : rows.start + rows.rank] = True
        got = float(layout.row_scale[view.table_index, rows.start])
        if abs(got - rows.scale) > 1e-2 * max(abs(rows.scale), 1.0):
            raise RuntimeError(f"layer {layer} {module} slot {slot}: scale {got} != {rows.scale}")
    if bool(view.lora_a[~live].any()) or bool(view.lora_b[~live].any()):
        raise RuntimeError(f"layer {layer} {module}: a row outside every live range is non-zero")
    if bool(layout.row_scale[view.table_index][layout.row_owner < 0].any()):
        raise RuntimeError(f"layer {layer} {module}: a free row has a non-zero scale")
