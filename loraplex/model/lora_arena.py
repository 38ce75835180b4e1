"""Storage behind :class:`~loraplex.model.lora.LoraSlotPool`: the arenas and the views over them.

Per target module the arenas of every layer are one buffer ``[num_layers, capacity_rows, d_in +
d_out]``: each row holds an A row then the matching B^T row. An adapter whose L1 copy is packed
the same way (:class:`~loraplex.model.adapter_weights.ModuleRun`) reaches its slot with one copy per
module, and a release is one zeroing per module, instead of two ops per (layer, module). A
(layer, module) "table" is the pair of views ``stack[layer, :, :d_in]`` and
``stack[layer, :, d_in:]``: row-strided, which BLAS reads at full speed (leading dimension).

The per-table slot views are kept in mutable lists and only the tables a load or a release
touches are re-frozen, so a load's bookkeeping does not grow with ``num_slots x num_tables``.

An L1 copy is immutable and goes back to L0 many times, so what the pool derives from it (the
checked table map, its scales as one device column, the destination views at a start row) is a
:class:`LoadPlan`, built once per copy (``PlanMemo``) rather than on every load: for a small
adapter those checks cost several times its copy.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.errors import BaseModelMismatchError, RankTooLargeError, TensorValidationError
from loraplex.model.adapter_weights import AdapterWeights, ModuleRun
from loraplex.model.buffers import serial_copy, serial_pieces_of, serial_zero, zeroed
from loraplex.ops import ModuleLoraWeights, SlotRows

K = TypeVar("K")
V = TypeVar("V")
EMPTY_ROWS = SlotRows(0, 0, 0.0)
MEMO_SIZE = 1024  # placements / zeroing views an ArenaStore keeps for every copy


class Bounded(Generic[K, V]):
    """A dict that forgets its oldest entry past ``size`` (views are cheap to make again)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: dict[K, V] = {}

    def get(self, key: K) -> V | None:
        return self._items.get(key)

    def put(self, key: K, value: V) -> None:
        if len(self._items) >= self.size:
            del self._items[next(iter(self._items))]
        self._items[key] = value


@dataclass(frozen=True, eq=False)  # holds tensors: compared by identity
class Placement:
    """A plan's rows and destinations at one start row (views into the pool's own stacks)."""

    rows: dict[int, SlotRows]  # table index -> the slot's rows there
    destinations: tuple[torch.Tensor, ...]  # one per source tensor, in ``sources`` order
    # the destinations cut as ``serial_copy`` cuts them: (piece, source index, the piece's
    # index into that source; () = the whole source), so a load slices only its sources
    pieces: tuple[tuple[torch.Tensor, int, tuple[slice, ...]], ...]


@dataclass(frozen=True, eq=False)  # holds tensors: compared by identity
class LoadPlan:
    """What loading one L1 copy writes, checked once (``ArenaStore.plan``). It holds no source
    tensor: a resident slot keeps its plan, and must not keep an evicted L1 copy alive."""

    pairs: dict[int, tuple[int, float]]  # table index -> (rank, scale) of targeted modules
    packed: bool  # the copy's runs hold exactly ``pairs``: one copy per run, else per module
    num_rows: int  # rows reserved in every arena (the copy's largest rank)
    num_bytes: int  # bytes of the copy's own A and B rows (its resident size)
    modules: frozenset[str]  # target modules it has rows in (the stacks a release must zero)
    # module -> rows ``start..start + n`` a load writes in every layer (its least rank there; 0
    # when a layer is untargeted): a replacement at its predecessor's start need not zero them
    covered: dict[str, int]
    # what its placements depend on (table -> (rank, scale) in source order, the runs' layout),
    # as a number the store gives each distinct layout: copies of one adapter share it, so a
    # fresh L1 copy reuses the store's placements (and the key hashes in constant time)
    layout: int
    scales: torch.Tensor  # [num_tables, 1] scale per table, 0 where untargeted (pool's device)
    released: dict[int, SlotRows]  # table index -> EMPTY_ROWS for every targeted table
    # start row -> placement there (at most capacity_rows entries; starts repeat)
    placements: dict[int, Placement] = field(default_factory=dict, compare=False)
    # start row -> the views a release of the copy there zeroes, cut as ``serial_zero`` does
    releases: dict[int, tuple[torch.Tensor, ...]] = field(default_factory=dict, compare=False)


def plan_sources(plan: LoadPlan, weights: AdapterWeights) -> list[torch.Tensor]:
    """The tensors ``plan``'s destinations are filled from, in order."""
    if plan.packed:
        return [run.rows for run in weights.runs]
    return [t for m in weights.modules for t in (m.lora_a, m.lora_b.T)]


class PlanMemo:
    """Plans of the L1 copies that are still alive, by identity (weak: a plan never outlives
    its copy here, so a recycled ``id`` cannot return another copy's plan)."""

    def __init__(self) -> None:
        self._plans: dict[int, tuple[weakref.ref[AdapterWeights], LoadPlan]] = {}

    def get(self, weights: AdapterWeights, build: Callable[[], LoadPlan]) -> LoadPlan:
        held = self._plans.get(id(weights))
        if held is not None and held[0]() is weights:
            return held[1]
        plan = build()  # raises before anything is remembered
        key = id(weights)
        ref = weakref.ref(weights, lambda dead: self._forget(key, dead))
        self._plans[key] = (ref, plan)
        return plan

    def _forget(self, key: int, dead: weakref.ref[AdapterWeights]) -> None:
        held = self._plans.get(key)
        if held is not None and held[0] is dead:
            self._plans.pop(key, None)


class ArenaStore:
    """Stacked per-module buffers, the (layer, module) -> table map and the per-table views."""

    def __init__(
        self,
        spec: BaseModelSpec,
        target_modules: tuple[str, ...],
        capacity_rows: int,
        num_slots: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_layers = spec.num_layers
        self.target_modules = target_modules
        self.stacks: dict[str, torch.Tensor] = {}  # module -> [layers, capacity, d_in + d_out]
        for module in target_modules:
            width = sum(spec.module_shape(module))
            shape = (spec.num_layers, capacity_rows, width)
            self.stacks[module] = zeroed(shape, dtype=dtype, device=device)
        self.tables: dict[tuple[int, str], int] = {}
        self.table_shapes: list[tuple[int, int]] = []  # per table: (d_in, d_out)
        self.table_module: list[str] = []  # per table: its target module
        self.arenas: list[tuple[torch.Tensor, torch.Tensor]] = []  # per table: (A, B^T) views
        for layer in range(spec.num_layers):
            for module in target_modules:
                self.tables[(layer, module)] = len(self.arenas)
                d_in, d_out = spec.module_shape(module)
                stack = self.stacks[module]
                self.table_shapes.append((d_in, d_out))
                self.table_module.append(module)
                self.arenas.append((stack[layer, :, :d_in], stack[layer, :, d_in:]))
        self._rows: list[list[SlotRows]] = [[EMPTY_ROWS] * num_slots for _ in self.arenas]
        self.views = [
            ModuleLoraWeights(a, b, tuple(rows), table)
            for table, ((a, b), rows) in enumerate(zip(self.arenas, self._rows, strict=True))
        ]
        # views into the stacks by layout and start row, shared by every copy (bounded)
        self._placements: Bounded[tuple[int, int], Placement] = Bounded(MEMO_SIZE)
        self._layouts: Bounded[tuple[object, ...], int] = Bounded(MEMO_SIZE)  # -> layout id
        self._next_layout = 0  # never reused: a forgotten layout comes back under a new id
        self._zero_views: Bounded[tuple[str, int, int], tuple[torch.Tensor, ...]] = Bounded(
            MEMO_SIZE
        )

    # --- plans ---------------------------------------------------------------------------------

    def plan(self, weights: AdapterWeights, max_lora_rank: int) -> LoadPlan:
        """Checks ``weights`` against the tables (``pairs_of``: raises before anything is
        written) and derives everything a load of it needs but its start row."""
        pairs = self.pairs_of(weights, max_lora_rank)
        scales = [0.0] * len(self.arenas)
        for table, (_, scale) in pairs.items():
            scales[table] = scale
        stack = next(iter(self.stacks.values()))
        shapes, element = self.table_shapes, stack.element_size()
        packed = self.runs_cover(weights.runs, pairs)
        runs = tuple((r.module, r.first_layer, r.num_layers, r.rank) for r in weights.runs)
        return LoadPlan(
            pairs,
            packed,
            max((rank for rank, _ in pairs.values()), default=0),
            element * sum(r * sum(shapes[t]) for t, (r, _) in pairs.items()),
            frozenset(self.table_module[t] for t in pairs),
            self._covered(pairs),
            self._layout_id((packed, tuple(pairs.items()), runs if packed else ())),
            torch.tensor(scales, dtype=stack.dtype).unsqueeze(1).to(stack.device),
            dict.fromkeys(pairs, EMPTY_ROWS),
        )

    def _layout_id(self, layout: tuple[object, ...]) -> int:
        found = self._layouts.get(layout)
        if found is None:
            found = self._next_layout
            self._next_layout += 1
            self._layouts.put(layout, found)
        return found

    def _covered(self, pairs: dict[int, tuple[int, float]]) -> dict[str, int]:
        """Per target module, the rows from the start that ``pairs`` write in every layer."""
        covered: dict[str, int] = {}
        for module in self.target_modules:
            ranks = [pairs.get(self.tables[(layer, module)]) for layer in range(self.num_layers)]
            covered[module] = min((0 if p is None else p[0] for p in ranks), default=0)
        return covered

    def place(self, plan: LoadPlan, weights: AdapterWeights, start: int) -> Placement:
        """``plan``'s rows and destinations at ``start``: made once per start row and layout
        (``plan.layout``: another copy of the same adapter finds them made)."""
        placement = plan.placements.get(start)
        if placement is None:
            placement = self._placements.get((plan.layout, start))
            if placement is None:
                rows = {t: SlotRows(start, r, s) for t, (r, s) in plan.pairs.items()}
                destinations = self._destinations(plan, weights, start)
                pieces = tuple(
                    (destination[index], source, index)
                    for source, destination in enumerate(destinations)
                    for index in serial_pieces_of(destination)
                )
                placement = Placement(rows, destinations, pieces)
                self._placements.put((plan.layout, start), placement)
            plan.placements[start] = placement
        return placement

    def release_views(
        self, plan: LoadPlan, start: int, written: dict[str, int] | None = None
    ) -> tuple[torch.Tensor, ...]:
        """What a release of ``plan``'s copy at ``start`` zeroes: rows ``start..start +
        num_rows`` of every layer of the stacks it wrote (the others are zero there already),
        but the first ``written[module]`` rows of each stack, which the next occupant at the
        same start overwrites in every layer; cut as ``serial_zero`` cuts them, made once per
        (module, rows) for every copy."""
        end = start + plan.num_rows
        if written is None:
            views = plan.releases.get(start)
            if views is None:
                views = tuple(
                    v for m in sorted(plan.modules) for v in self.zero_views(m, start, end)
                )
                plan.releases[start] = views
            return views
        return tuple(
            view
            for module in sorted(plan.modules)
            for view in self.zero_views(module, min(start + written[module], end), end)
        )

    def zero_views(self, module: str, lo: int, hi: int) -> tuple[torch.Tensor, ...]:
        """Rows ``lo..hi`` of every layer of ``module``'s stack, cut as ``serial_zero`` cuts
        them (none when ``lo >= hi``)."""
        if lo >= hi:
            return ()
        views = self._zero_views.get((module, lo, hi))
        if views is None:
            whole = self.stacks[module][:, lo:hi]
            views = tuple(whole[index] for index in serial_pieces_of(whole))
            self._zero_views.put((module, lo, hi), views)
        return views

    def _destinations(
        self, plan: LoadPlan, weights: AdapterWeights, start: int
    ) -> tuple[torch.Tensor, ...]:
        if plan.packed:  # the run's layers land at rows ``start..start+rank``: one copy per run
            return tuple(
                self.stacks[run.module][
                    run.first_layer : run.first_layer + run.num_layers, start : start + run.rank
                ]
                for run in weights.runs
            )
        views: list[torch.Tensor] = []
        for module in weights.modules:
            lora_a, lora_b_t = self.arenas[self.tables[(module.layer, module.module)]]
            rows = slice(start, start + module.rank)
            views += (lora_a[rows], lora_b_t[rows])
        return tuple(views)

    # --- weights ------------------------------------------------------------------------------

    @staticmethod
    def write(placement: Placement, sources: list[torch.Tensor], non_blocking: bool) -> None:
        """Copies every source into its destination (on the CPU on this thread alone: in the
        pieces ``serial_copy`` would cut, made once per placement)."""
        if len(sources) != len(placement.destinations):
            raise ValueError(
                f"{len(sources)} sources for {len(placement.destinations)} destinations"
            )
        for piece, source, index in placement.pieces:
            if non_blocking:
                piece.copy_(sources[source], non_blocking=True)  # a device: one piece each
            else:
                piece.copy_(sources[source][index] if index else sources[source])

    def runs_cover(self, runs: tuple[ModuleRun, ...], pairs: dict[int, tuple[int, float]]) -> bool:
        """True when ``runs`` hold exactly the checked pairs (table -> (rank, scale)) at their
        ranks, so copying the runs is copying the modules."""
        if not runs or sum(run.num_layers for run in runs) != len(pairs):
            return False
        for run in runs:
            for layer in range(run.first_layer, run.first_layer + run.num_layers):
                table = self.tables.get((layer, run.module))
                if table is None or table not in pairs or pairs[table][0] != run.rank:
                    return False
        return True

    def pairs_of(self, weights: AdapterWeights, max_lora_rank: int) -> dict[int, tuple[int, float]]:
        """Every module of ``weights`` fits a table, once, at a rank <= ``max_lora_rank``;
        returns table index -> (rank, scale). Raises before anything is written."""
        pairs: dict[int, tuple[int, float]] = {}
        for module in weights.modules:
            table = self.tables.get((module.layer, module.module))
            rank = int(module.lora_a.shape[0])
            if table is None:
                raise BaseModelMismatchError(
                    f"adapter {weights.digest[:12]}: layer {module.layer} {module.module} is not "
                    f"served by this pool; expected layers < {self.num_layers} and modules "
                    f"in {self.target_modules}"
                )
            if rank > max_lora_rank:
                raise RankTooLargeError(
                    "rank",
                    rank,
                    f"<= max_lora_rank {max_lora_rank} (layer {module.layer} {module.module})",
                )
            d_in, d_out = self.table_shapes[table]
            expected = ((rank, d_in), (d_out, rank))
            shapes = (tuple(module.lora_a.shape), tuple(module.lora_b.shape))
            if rank < 1 or shapes != expected or table in pairs:
                raise TensorValidationError(
                    f"adapter {weights.digest[:12]}: layer {module.layer} {module.module} has "
                    f"A, B shapes {shapes}; expected {expected}, rank >= 1, once per module"
                )
            pairs[table] = (rank, module.scale)
        return pairs

    def move_rows(self, source: int, target: int, num_rows: int) -> None:
        """Move rows down (target < source) in every stack; the vacated tail is zeroed. Copies
        in pieces no longer than the shift, so no piece overlaps its source and nothing is
        allocated (a clone of a whole arena costs page faults while the forward waits)."""
        step = source - target
        vacated = slice(max(target + num_rows, source), source + num_rows)
        for stack in self.stacks.values():
            for offset in range(0, num_rows, step):
                n = min(step, num_rows - offset)
                dst = stack[:, target + offset : target + offset + n]
                serial_copy(dst, stack[:, source + offset : source + offset + n])
            serial_zero(stack[:, vacated])

    # --- views --------------------------------------------------------------------------------

    def set_slot(self, slot: int, rows: dict[int, SlotRows], *, refreeze: bool = False) -> None:
        """Record ``slot``'s rows in the given tables; call :meth:`refreeze` on them after, or
        pass ``refreeze`` True to publish exactly these tables in the same pass."""
        if not refreeze:
            for table, entry in rows.items():
                self._rows[table][slot] = entry
            return
        views = list(self.views)
        for table, entry in rows.items():
            slots = self._rows[table]
            slots[slot] = entry
            views[table] = views[table].with_slots(tuple(slots))
        self.views = views

    def refreeze(self, tables: Iterable[int]) -> None:
        """Publish new immutable views of ``tables``; the list is replaced, never mutated, so
        a reader holding the old list sees one consistent generation."""
        views = list(self.views)
        for table in tables:
            views[table] = views[table].with_slots(tuple(self._rows[table]))
        self.views = views
