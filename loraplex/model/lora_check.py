"""A slot pool's invariants, checked from its public views only (``LoraSlotPool.check_integrity``
calls this). It reads the pool through ``PoolView``, so it depends on what a pool shows, not on
the pool's module: the checker is its own responsibility, not a method moved out to save lines."""

from __future__ import annotations

from typing import Protocol

import torch

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.ops import ArenaLayout, ModuleLoraWeights


class RowRange(Protocol):
    """The rows one resident adapter owns in the arena."""

    @property
    def start(self) -> int: ...

    @property
    def num_rows(self) -> int: ...


class PoolView(Protocol):
    """What the checker reads of a pool."""

    @property
    def spec(self) -> BaseModelSpec: ...

    @property
    def target_modules(self) -> tuple[str, ...]: ...

    @property
    def capacity_rows(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def layout(self) -> ArenaLayout: ...

    def occupied_slots(self) -> tuple[int, ...]: ...

    def slot_info(self, slot: int) -> RowRange | None: ...

    def module_weights(self, layer: int, module: str) -> ModuleLoraWeights: ...


def check_pool_integrity(pool: PoolView) -> None:
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


def _check_table(pool: PoolView, layer: int, module: str) -> None:
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
