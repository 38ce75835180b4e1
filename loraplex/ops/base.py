"""The batched mixed-adapter LoRA op: its contract, the weight layout it reads, per-step metadata.

The op, for one target module (``x: [num_tokens, d_in]``, ``out: [num_tokens, d_out]``)::

    for t in range(num_tokens):
        s = token_slots[t]  # -1: base only, nothing added
        if s >= 0 and rank[s] > 0:
            out[t] += scale[s] * (x[t] @ A[s].T) @ B[s].T  # A[s]: [rank, d_in], B[s]: [d_out, rank]

Weight layout (the "arena"): every slot's LoRA pair lives in one packed row range of a per-module
buffer, ``lora_a: [capacity_rows, d_in]`` and ``lora_b: [capacity_rows, d_out]`` (B stored
transposed, one row per rank dimension). Row ranges are identical in every (layer, module) of a
pool, so one row-ownership vector serves all modules. Packing rank-exact rows next to each other
is what lets one matmul cover every active adapter without paying the maximum rank for everyone.

NOTE: rows that belong to no slot, and rows beyond a module's own rank inside a slot's range,
are kept zero by the pool; backends may read them (they add exactly nothing).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import torch


@dataclass(frozen=True)
class SlotRows:
    """Where one slot's LoRA pair lies in one module's arena."""

    start: int  # first arena row of the slot
    rank: int  # this module's rank for the slot's adapter; 0 = untargeted or empty slot
    scale: float  # PEFT scaling (alpha/r or alpha/sqrt(r)) of this module; 0.0 when rank is 0


MAX_STRIDED_VIEWS = 256  # per arena view and cache: the views ModuleLoraWeights keeps
K = TypeVar("K")
_Views = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class ModuleLoraWeights:
    """One (layer, module)'s arena plus the slot table that indexes it."""

    lora_a: torch.Tensor  # [capacity_rows, d_in] A rows of every slot, packed
    lora_b: torch.Tensor  # [capacity_rows, d_out] B^T rows of every slot, packed like lora_a
    slots: tuple[SlotRows, ...]  # per slot index (length max_loras)
    table_index: int  # this module's row in ArenaLayout.row_scale and LoraBatch.mask
    # (start, rank) -> (A rows transposed, B^T rows): a slot's views, made on first use and kept
    # as long as this arena view (a step's per-run slicing cost as much as its matmuls on a CPU)
    _pairs: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, compare=False, repr=False
    )
    # (row_lo, num_blocks, block_rows) -> the block views of :meth:`blocks`, kept likewise
    _blocks: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, compare=False, repr=False
    )
    # (row_lo, row_stride, num_blocks, block_rows) -> the views of :meth:`strided`, kept likewise
    _strided: dict[tuple[int, int, int, int], tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def with_slots(self, slots: tuple[SlotRows, ...]) -> ModuleLoraWeights:
        """The same arena under another slot table. The views kept per row range carry over
        (they depend on the arena and the rows alone, never on which slot holds them), so a
        load re-publishing a table neither rebuilds them nor pays a dataclass's construction."""
        fresh = object.__new__(ModuleLoraWeights)
        fresh.__dict__.update(self.__dict__)
        fresh.__dict__["slots"] = slots
        return fresh

    def pair(self, rows: SlotRows) -> tuple[torch.Tensor, torch.Tensor]:
        """``(A.T, B^T)`` of the slot whose rows are ``rows`` (``rows.rank`` > 0): ``x @ A.T``
        is the shrink, ``hidden @ B^T`` the expand."""
        key = (rows.start, rows.rank)
        got = self._pairs.get(key)
        if got is None:
            span = slice(rows.start, rows.start + rows.rank)
            got = _kept(self._pairs, key, (self.lora_a[span].T, self.lora_b[span]))
        return got

    def blocks(self, plan: BlockPlan) -> tuple[torch.Tensor, torch.Tensor]:
        """``(A.T, B^T)`` of ``plan``'s blocks as batches, ``[num_blocks, d_in, block_rows]``
        and ``[num_blocks, block_rows, d_out]``: strided views of the arena, never copies."""
        key = (plan.row_lo, plan.num_blocks, plan.block_rows)
        got = self._blocks.get(key)
        if got is None:
            span = slice(plan.row_lo, plan.row_lo + plan.num_blocks * plan.block_rows)
            lora_a = self.lora_a[span].view(plan.num_blocks, plan.block_rows, -1)
            lora_b = self.lora_b[span].view(plan.num_blocks, plan.block_rows, -1)
            got = _kept(self._blocks, key, (lora_a.transpose(1, 2), lora_b))
        return got

    def strided(self, group: BlockGroup) -> tuple[torch.Tensor, torch.Tensor]:
        """``(A.T, B^T)`` of ``group``'s blocks, ``[num_blocks, d_in, block_rows]`` and
        ``[num_blocks, block_rows, d_out]``: block ``i`` is the ``block_rows`` rows from
        ``row_lo + i * row_stride``; strided views of the arena, never copies."""
        key = (group.row_lo, group.row_stride, group.num_blocks, group.block_rows)
        got = self._strided.get(key)
        if got is None:
            pair = (
                _row_blocks(self.lora_a, group).transpose(1, 2),
                _row_blocks(self.lora_b, group),
            )
            got = _kept(self._strided, key, pair)
        return got


def _kept(views: dict[K, _Views], key: K, value: _Views) -> _Views:
    """``value`` stored under ``key`` in a view cache of :class:`ModuleLoraWeights`, which is
    emptied first when it holds ``MAX_STRIDED_VIEWS``: the caches outlive a re-publication
    (``with_slots``), and steps' subsets of slots and row ranges vary, so each is bounded."""
    if len(views) >= MAX_STRIDED_VIEWS:
        views.clear()
    views[key] = value
    return value


def _row_blocks(rows: torch.Tensor, group: BlockGroup) -> torch.Tensor:
    """``rows`` ([n, d], unit column stride) viewed as ``group``'s ``[num_blocks, block_rows,
    d]`` blocks."""
    step = rows.stride(0)
    return rows.as_strided(
        (group.num_blocks, group.block_rows, rows.shape[1]),
        (group.row_stride * step, step, rows.stride(1)),
        rows.storage_offset() + group.row_lo * step,
    )


@dataclass(frozen=True)
class ArenaLayout:
    """Which arena rows belong to which slot, shared by every (layer, module) of a pool."""

    row_owner: torch.Tensor  # [capacity_rows] int64 slot owning each row, -1 = free (device)
    row_scale: torch.Tensor  # [num_tables, capacity_rows] scale of each row per module (device)
    slot_starts: tuple[int, ...]  # first row per slot (0 for empty slots)
    slot_rows: tuple[int, ...]  # rows reserved per slot (its largest rank; 0 = empty slot)
    module_slot_bits: tuple[int, ...]  # per table: bit s set when slot s has rank > 0 there
    # mean ``d_in + d_out`` over the pool's modules: the multiply-adds one rank row costs a token
    # per module (AutoBackend weighs the masked op's wasted rows with it); 0 = unknown
    width: int = 0


class Strategy(enum.Enum):
    """How a step's LoRA delta is computed; chosen once per step in ``prepare``."""

    NONE = "none"  # no token uses an adapter: apply adds nothing
    MASKED = "masked"  # one matmul over the active row range, per-token scaled mask, one matmul
    GROUPED = "grouped"  # one (A, B) matmul pair per run of tokens sharing a slot, rank-exact
    BATCHED = "batched"  # one batched (A, B) matmul pair over equal-rank slots' row blocks
    LOOP = "loop"  # reference: per active slot, gather its tokens, PEFT's expression


@dataclass(frozen=True)
class Segment:
    """A run of tokens (in ``LoraBatch.order`` when set, else natural order) sharing one slot."""

    start: int  # first token position of the run
    end: int  # one past the last token position
    slot: int  # the slot every token in the run uses (never -1: base-only runs are dropped)


@dataclass(frozen=True, eq=False)  # holds tensors: compared by identity
class BlockPlan:
    """BATCHED: the active slots all reserve ``block_rows`` rows, on a grid starting at
    ``row_lo``, so rows ``[row_lo, row_lo + num_blocks * block_rows)`` are ``num_blocks`` equal
    blocks (one per slot, or unused) that one batched matmul reads in place. Each block gets
    ``tokens_per_block`` input rows: its slot's tokens, then zero rows (padding)."""

    row_lo: int  # first arena row of block 0
    num_blocks: int  # blocks from the first to the last active slot's (unused ones between)
    block_rows: int  # rows per block: every active slot's reservation (its largest rank)
    tokens_per_block: int  # most tokens any active slot has this step
    scales: torch.Tensor  # [num_tables, num_blocks, 1, 1] each block's scale per module (device)
    # per table: the scale every active block shares there (one matmul's alpha), else None
    alphas: tuple[float | None, ...]
    # adapter tokens' indices in x, and their rows in the padded [num_blocks * tokens_per_block]
    # input; both None when that input is exactly x's first rows (sorted, no padding)
    tokens: torch.Tensor | None = None
    positions: torch.Tensor | None = None


@dataclass(frozen=True)
class BlockGroup:
    """One rank class of a :class:`BlockSet`: ``num_blocks`` slots that reserve ``block_rows``
    rows each, starting at ``row_lo + i * row_stride`` (any stride: one batched matmul reads
    them in place), with ``tokens_per_block`` rows each of the padded input from ``offset``."""

    row_lo: int  # first arena row of block 0
    row_stride: int  # arena rows from one block's start to the next's (>= block_rows)
    num_blocks: int  # active slots of the class, in arena order
    block_rows: int  # rows every slot of the class reserves
    tokens_per_block: int  # most tokens any slot of the class has this step
    offset: int  # first row of the class in the padded input


@dataclass(frozen=True, eq=False)  # holds tensors: compared by identity
class BlockSet:
    """BATCHED when the active slots share no one grid (several ranks): one batched matmul pair
    per rank class. Every adapter token is gathered once into a padded input, class after
    class, block after block; a padding row repeats a token of its own block and is scaled by 0,
    so it adds nothing and never carries another slot's values."""

    groups: tuple[BlockGroup, ...]  # in padded-input order
    rows: int  # rows of the padded input (sum of num_blocks x tokens_per_block)
    tokens: torch.Tensor  # [rows] int64: the token of x each padded row reads and adds to
    scales: torch.Tensor  # [num_tables, rows, 1] its slot's scale per module; 0 on padding
    # per table: the scale every padded row shares there when nothing is padded, else None
    alphas: tuple[float | None, ...]


@dataclass(frozen=True)
class LoraBatch:
    """Per-step metadata, built once per forward and shared by every layer and module."""

    token_slots: torch.Tensor  # [num_tokens] int64 slot per token, -1 = base only
    num_tokens: int  # rows of x / out every apply receives this step
    strategy: Strategy  # which computation apply runs
    active_bits: int  # bit s set when some token uses slot s (0: strategy is NONE)
    segments: tuple[Segment, ...] = ()  # GROUPED/LOOP: runs of tokens per slot
    order: torch.Tensor | None = None  # GROUPED: token permutation grouping slots; None = as is
    row_lo: int = 0  # MASKED: first arena row the matmuls cover
    row_hi: int = 0  # MASKED: one past the last arena row covered
    mask: torch.Tensor | None = None  # MASKED: [num_tables, num_tokens, row_hi-row_lo] scales
    # MASKED: [num_tokens, row_hi-row_lo] True where a token does not use that row's adapter
    misses: torch.Tensor | None = None
    active_tables: tuple[bool, ...] = ()  # per table: some active slot has a LoRA pair there
    grid: BlockPlan | None = None  # BATCHED: the row blocks and where each token goes
    classes: BlockSet | None = None  # BATCHED without one grid: the blocks per rank class
    # GROUPED, gathered (``order`` set): the runs in float32, added to ``out``'s rows with one
    # rounding (16-bit weights on a CPU: plan.runs_in_float32, plan.float32_slots)
    float32: bool = False
    # GROUPED float32: the slots whose runs are long enough to stay in the dtype (each run's
    # delta is added to the float32 sum; empty: every run in float32)
    dtype_runs: frozenset[int] = frozenset()

    @property
    def adds_nothing(self) -> bool:
        """No token of the step needs LoRA work: every ``apply`` would return ``out`` as is
        (the model then skips the calls)."""
        return self.strategy is Strategy.NONE


class LoraBackend(Protocol):
    """A way to compute the op; registered by name in :mod:`loraplex.ops`."""

    name: str  # registry name

    def prepare(self, token_slots: torch.Tensor, layout: ArenaLayout) -> LoraBatch:
        """Build the step's metadata once (host syncs, sorting, masks happen here only)."""
        ...

    def apply(
        self, x: torch.Tensor, out: torch.Tensor, weights: ModuleLoraWeights, batch: LoraBatch
    ) -> torch.Tensor:
        """Add the LoRA delta of every token to ``out`` in place and return ``out``."""
        ...
