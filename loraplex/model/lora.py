"""The GPU slot pool (tier L0): preallocated packed LoRA buffers per target module.

Per (layer, module) the pool owns one arena ``A: [max_loras * max_lora_rank, d_in]`` and
``B^T: [max_loras * max_lora_rank, d_out]`` allocated once at construction. A loaded adapter
occupies a contiguous range of rows, as many as its largest rank, at the same position in every
arena; ranges are packed (a replacement at its predecessor's start when it fits there, else
first fit; compacted when fragmented) so the rows of the active adapters sit side by side and
one matmul can cover them at their exact ranks.

Storage and views live in :class:`~loraplex.model.lora_arena.ArenaStore` (per module one buffer
stacked over layers, so a packed L1 copy moves in one op per module and matrix), which also
checks that an adapter's modules fit its tables before anything is written.

Invariants (``check_integrity``): ranges of occupied slots never overlap; every row outside them,
and every row past a module's own rank inside one, is zero with scale 0; ``row_owner`` names the
slot of every occupied row and -1 elsewhere.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from loraplex.artifacts.base_model import TARGET_MODULES, BaseModelSpec, lora_bytes
from loraplex.model.adapter_weights import AdapterWeights
from loraplex.model.lora_arena import (
    MEMO_SIZE,
    ArenaStore,
    Bounded,
    LoadPlan,
    PlanMemo,
    plan_sources,
)
from loraplex.model.lora_check import check_pool_integrity
from loraplex.ops import ArenaLayout, LoraBatch, ModuleLoraWeights, SlotRows, get_backend


@dataclass(frozen=True)
class SlotInfo:
    """What occupies one slot."""

    digest: str  # sha256 of the adapter's safetensors file
    start: int  # first arena row
    num_rows: int  # rows reserved in every arena (the adapter's largest rank)
    num_bytes: int  # bytes of the adapter's own A and B rows (its resident size)


class OpTimer:
    """Seconds the pool's LoRA work (``prepare`` and every ``apply``) took during one measured
    step. On a CUDA device each timed call is bracketed by synchronizations, so the figure is the
    device's work, not the launch; only the measured steps pay for that."""

    def __init__(self, device: torch.device) -> None:
        self.seconds = 0.0  # accumulated over the step's calls
        self._cuda = device if device.type == "cuda" else None

    def start(self) -> float:
        if self._cuda is not None:
            torch.cuda.synchronize(self._cuda)
        return time.perf_counter()

    def stop(self, started: float) -> None:
        if self._cuda is not None:
            torch.cuda.synchronize(self._cuda)
        self.seconds += time.perf_counter() - started


@dataclass(frozen=True)
class _Prepared:
    """The last step's metadata and what it was built from (``LoraSlotPool.prepare``)."""

    slots: list[int]  # the token slots' values
    layout: ArenaLayout  # the layout then published (a load or clear publishes a new one)
    backend: object  # the backend that built it
    batch: LoraBatch


@dataclass(frozen=True)
class _Resident:
    info: SlotInfo  # public view
    plan: LoadPlan  # its tables, ranks, scales and modules


class LoraSlotPool:
    """``max_loras`` slots of rank up to ``max_lora_rank`` on every module in ``target_modules``."""

    def __init__(
        self,
        spec: BaseModelSpec,
        max_loras: int,
        max_lora_rank: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
        backend: str = "auto",
        target_modules: tuple[str, ...] = TARGET_MODULES,
    ) -> None:
        if max_loras < 1:
            raise ValueError(f"max_loras {max_loras} is invalid; expected >= 1")
        if max_lora_rank < 1:
            raise ValueError(f"max_lora_rank {max_lora_rank} is invalid; expected >= 1")
        unknown = [m for m in target_modules if m not in TARGET_MODULES]
        if unknown or not target_modules:
            raise ValueError(
                f"target_modules {target_modules} is invalid; expected a subset of {TARGET_MODULES}"
            )
        self.spec, self.max_loras, self.max_lora_rank = spec, max_loras, max_lora_rank
        self.dtype, self.device = dtype, torch.device(device)
        self.target_modules = target_modules
        self.backend = get_backend(backend)
        self.capacity_rows = max_loras * max_lora_rank
        self._store = ArenaStore(
            spec, target_modules, self.capacity_rows, max_loras, dtype=dtype, device=self.device
        )
        self._tables = self._store.tables
        self._arenas = self._store.arenas
        self._row_owner = torch.full((self.capacity_rows,), -1, dtype=torch.int64, device=device)
        self._row_scale = torch.zeros(
            (len(self._arenas), self.capacity_rows), dtype=dtype, device=device
        )
        self._module_bits = [0] * len(self._arenas)  # per table: bit s = slot s has rows there
        # (lo, hi) -> (row_owner[lo:hi], row_scale[:, lo:hi]): see _row_views
        self._row_slices: Bounded[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]
        self._row_slices = Bounded(MEMO_SIZE)
        widths = [a.shape[1] + b.shape[1] for a, b in self._arenas]
        self._width = round(sum(widths) / len(widths))  # ArenaLayout.width
        self._residents: list[_Resident | None] = [None] * max_loras
        self._plans = PlanMemo()  # per live L1 copy: checked once, not on every load
        self.last_strategy = "none"  # the strategy of the last prepared step (traces read it)
        # set for one step whose LoRA work is measured (engine.mode_control); None: not timed
        self.op_timer: OpTimer | None = None
        self._prepared: _Prepared | None = None  # the last step's metadata, reused while equal
        self._publish(())

    # --- execution ------------------------------------------------------------------------

    def prepare(self, token_slots: torch.Tensor) -> LoraBatch:
        """Per-step metadata for ``token_slots`` ([num_tokens] int64, -1 = base only)."""
        timer = self.op_timer
        started = 0.0 if timer is None else timer.start()
        batch = self._prepare(token_slots)
        self.last_strategy = batch.strategy.value  # a str already held by the enum: no alloc
        if timer is not None:
            timer.stop(started)
        return batch

    def _prepare(self, token_slots: torch.Tensor) -> LoraBatch:
        """The backend's metadata, or the last step's when the token slots, the layout and the
        backend are the ones it was built from: consecutive decode steps of one batch repeat
        their slots, and building the plan cost 0.2-0.6 ms of a large-preset step
        (docs/benchmarks/execution.md, "The adapters' cost on the large preset"). A batch
        holds its own copy of the slots, so a caller reusing its tensor changes nothing."""
        values = token_slots.tolist() if token_slots.dim() == 1 else None
        last = self._prepared
        if (
            last is not None
            and values is not None
            and last.layout is self._layout
            and last.backend is self.backend
            and last.slots == values
        ):
            return last.batch
        own = token_slots.to(self.device, torch.int64, copy=True)
        batch = self.backend.prepare(own, self._layout)
        if values is not None:  # only a batch the backend accepted is kept
            self._prepared = _Prepared(values, self._layout, self.backend, batch)
        return batch

    def apply(
        self, layer: int, module: str, x: torch.Tensor, out: torch.Tensor, batch: LoraBatch
    ) -> torch.Tensor:
        """Add the LoRA delta of each token's slot to ``out`` ([num_tokens, d_out]) in place.

        ``x`` is the module's input ([num_tokens, d_in]); returns ``out``. Modules outside
        ``target_modules`` and slots that do not target this module add nothing.
        """
        table = self._tables.get((layer, module))
        if table is None:
            return out
        timer = self.op_timer
        if timer is None:
            return self.backend.apply(x, out, self._store.views[table], batch)
        started = timer.start()
        result = self.backend.apply(x, out, self._store.views[table], batch)
        timer.stop(started)
        return result

    # --- residency --------------------------------------------------------------------------

    def load(self, slot: int, weights: AdapterWeights) -> None:
        """Copy ``weights`` into ``slot`` (replacing its occupant); nothing changes on error."""
        self._check_slot(slot)
        plan = self._plans.get(weights, lambda: self._store.plan(weights, self.max_lora_rank))
        touched: Iterable[int] = plan.pairs  # the tables re-published (a set once merged)
        own_tables_only = True  # a free slot, nothing moved: only its own tables change
        previous = self._residents[slot]
        start = self._find_rows(plan.num_rows, slot)
        kept: tuple[int, int] | None = None  # rows the slot owns before and after this load
        if previous is not None:
            own_tables_only = False
            touched = {*plan.pairs, *previous.plan.pairs}
            if start is not None:
                old = previous.info.start
                kept = (max(old, start), min(old + previous.info.num_rows, start + plan.num_rows))
            # at the same start, the rows this load writes in every layer are not zeroed first
            same = start is not None and start == previous.info.start
            self._release(slot, kept, plan.covered if same else None)
        if start is None:
            start = self._compact()
            own_tables_only = False
            touched = range(len(self._arenas))
        placement = self._store.place(plan, weights, start)
        self._store.write(placement, plan_sources(plan, weights), self.device.type == "cuda")
        for lo, hi in _outside(start, start + plan.num_rows, kept):
            self._row_views(lo, hi)[0].fill_(slot)
        self._row_views(start, start + plan.num_rows)[1].copy_(plan.scales)
        info = SlotInfo(weights.digest, start, plan.num_rows, plan.num_bytes)
        self._residents[slot] = _Resident(info, plan)
        bit, bits = 1 << slot, self._module_bits
        for table in plan.pairs:
            bits[table] |= bit
        if own_tables_only:  # its rows recorded and its tables published in one pass
            self._store.set_slot(slot, placement.rows, refreeze=True)
            self._publish_layout()
        else:
            self._store.set_slot(slot, placement.rows)
            self._publish(touched)

    def clear(self, slot: int) -> None:
        """Make ``slot`` inert: its rows are zeroed and its tokens get the base output only."""
        self._check_slot(slot)
        resident = self._residents[slot]
        if resident is not None:
            self._release(slot)
            self._publish(resident.plan.pairs)

    # --- introspection -----------------------------------------------------------------------

    @property
    def num_slots(self) -> int:
        return self.max_loras

    @property
    def bytes_per_slot(self) -> int:
        """Device bytes one slot reserves (its capacity at ``max_lora_rank``)."""
        return lora_bytes(self.spec, self.max_lora_rank, self._element_size(), self.target_modules)

    @property
    def total_bytes(self) -> int:
        """Device bytes of every arena together (``num_slots * bytes_per_slot``)."""
        return self.num_slots * self.bytes_per_slot

    def occupied_slots(self) -> tuple[int, ...]:
        return tuple(i for i, resident in enumerate(self._residents) if resident is not None)

    def free_slots(self) -> tuple[int, ...]:
        return tuple(i for i, resident in enumerate(self._residents) if resident is None)

    def slot_info(self, slot: int) -> SlotInfo | None:
        """The slot's occupant, or None when the slot is free."""
        self._check_slot(slot)
        resident = self._residents[slot]
        return None if resident is None else resident.info

    def targets(self, layer: int, module: str) -> bool:
        """Whether ``(layer, module)`` has an arena (a target module of this pool)."""
        return (layer, module) in self._tables

    def module_weights(self, layer: int, module: str) -> ModuleLoraWeights:
        """The arena view one (layer, module) is computed from."""
        return self._store.views[self._tables[(layer, module)]]

    @property
    def layout(self) -> ArenaLayout:
        return self._layout

    def check_integrity(self) -> None:
        """Verify the invariants in the module docstring; raises RuntimeError when broken."""
        check_pool_integrity(self)

    # --- internals -----------------------------------------------------------------------------

    def _element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.max_loras:
            raise ValueError(f"slot {slot} is invalid; expected 0 <= slot < {self.max_loras}")

    def _release(
        self,
        slot: int,
        kept: tuple[int, int] | None = None,
        written: dict[str, int] | None = None,
    ) -> None:
        """Zeroes ``slot``'s rows and frees them; rows ``kept`` (its next occupant's, already
        decided) keep the slot as their owner, and the load rewrites their scales. With
        ``written`` (the next occupant lands at the same start) the first ``written[module]``
        rows of each stack are left to the load, which overwrites them in every layer."""
        resident = self._residents[slot]
        if resident is None:
            return
        start, num_rows = resident.info.start, resident.info.num_rows
        for view in self._store.release_views(resident.plan, start, written):
            view.zero_()
        for lo, hi in _outside(start, start + num_rows, kept):
            owner, scale = self._row_views(lo, hi)
            owner.fill_(-1)
            scale.fill_(0)
        self._store.set_slot(slot, resident.plan.released)
        for table in resident.plan.pairs:
            self._module_bits[table] &= ~(1 << slot)
        self._residents[slot] = None

    def _row_views(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``row_owner[lo:hi]`` and ``row_scale[:, lo:hi]``, sliced once per range: on a CPU a
        slice costs as much as the fill or copy into it (2-4 us each on a 2-core Milan), and a
        slot's loads and releases repeat the same few ranges. Both tensors live as long as the
        pool, so a kept view never goes stale."""
        views = self._row_slices.get((lo, hi))
        if views is None:
            views = (self._row_owner[lo:hi], self._row_scale[:, lo:hi])
            self._row_slices.put((lo, hi), views)
        return views

    def _find_rows(self, num_rows: int, slot: int) -> int | None:
        """Where ``slot``'s next ``num_rows`` rows go, its current rows counted free: at its
        current start when they fit there (a slot whose occupants take turns at similar ranks
        then does not fragment the arena into compactions), else the first free range; None
        when none is contiguous (compact then)."""
        ranges = sorted(
            (r.info.start, r.info.num_rows)
            for s, r in enumerate(self._residents)
            if r is not None and s != slot
        )
        own = self._residents[slot]
        if own is not None:
            home, end = own.info.start, own.info.start + num_rows
            if end <= self.capacity_rows and all(a + n <= home or a >= end for a, n in ranges):
                return home
        cursor = 0
        for start, rows in ranges:
            if start - cursor >= num_rows:
                return cursor
            cursor = start + rows
        if self.capacity_rows - cursor >= num_rows:
            return cursor
        return None

    def _compact(self) -> int:
        """Move every occupied range down to close gaps; returns the first free row after them."""
        cursor = 0
        for slot in sorted(self.occupied_slots(), key=self._start_of):
            resident = self._residents[slot]
            if resident is None:
                continue
            start, num_rows = resident.info.start, resident.info.num_rows
            if start != cursor:
                self._move_rows(start, cursor, num_rows)
                info = SlotInfo(resident.info.digest, cursor, num_rows, resident.info.num_bytes)
                self._residents[slot] = _Resident(info, resident.plan)
                moved = {t: SlotRows(cursor, r, s) for t, (r, s) in resident.plan.pairs.items()}
                self._store.set_slot(slot, moved)
            cursor += num_rows
        return cursor

    def _start_of(self, slot: int) -> int:
        resident = self._residents[slot]
        return 0 if resident is None else resident.info.start

    def _move_rows(self, source: int, target: int, num_rows: int) -> None:
        """Move rows down (target < source); the vacated tail is zeroed, keeping free rows zero."""
        self._store.move_rows(source, target, num_rows)
        src, dst = slice(source, source + num_rows), slice(target, target + num_rows)
        vacated = slice(max(target + num_rows, source), source + num_rows)
        self._row_owner[dst] = self._row_owner[src].clone()
        self._row_owner[vacated] = -1
        self._row_scale[:, dst] = self._row_scale[:, src].clone()
        self._row_scale[:, vacated] = 0

    def _publish(self, tables: Iterable[int]) -> None:
        """Re-freeze the views of ``tables`` and the layout the backends read."""
        self._store.refreeze(tables)
        self._publish_layout()

    def _publish_layout(self) -> None:
        """Publish the layout the backends read (after the views of the tables changed)."""
        starts = [0] * self.max_loras
        rows = [0] * self.max_loras
        for slot, resident in enumerate(self._residents):
            if resident is not None:
                starts[slot], rows[slot] = resident.info.start, resident.info.num_rows
        self._layout = ArenaLayout(
            self._row_owner,
            self._row_scale,
            tuple(starts),
            tuple(rows),
            tuple(self._module_bits),
            width=self._width,
        )


def _outside(lo: int, hi: int, kept: tuple[int, int] | None) -> tuple[tuple[int, int], ...]:
    """The parts of rows ``lo..hi`` outside ``kept`` (None or an empty range: all of them)."""
    if kept is None or kept[0] >= kept[1]:
        return ((lo, hi),) if lo < hi else ()
    below, above = (lo, min(hi, kept[0])), (max(lo, kept[1]), hi)
    return tuple(part for part in (below, above) if part[0] < part[1])
