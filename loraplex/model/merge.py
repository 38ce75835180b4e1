"""Merged execution: one adapter folded into the base weights, the others still batched.

While an adapter is merged (``W' = W + s * B @ A`` on every (layer, module) it targets, computed
in float32 and stored in the model's dtype), its tokens need no LoRA work at all. Every other
token (another adapter's, or the base model's) gets the merged delta taken back out through the
same batched LoRA op: a second slot holds the same adapter at negative scale (a one-slot pool of
its own, so the adapter cache's slots and byte budgets are not touched), applied to every
non-merged token. Mixed batches therefore keep working and nothing is refused.

With the torch backends the subtraction rides the ordinary pass (ops/merged_op.py): the
non-merged tokens are gathered once, get their own adapter's delta and the negative copy's in
one pass, and the sum is scattered back once (grouped, when each of their slots is one run
already, their own runs read ``x`` in place and only the negative pass gathers); the merged
revision's tokens cost no LoRA work and no gather at all. On a CPU with 16-bit weights and few
foreign tokens, ``auto`` runs that pass in float32 (ops/merged_op.py; the negative copy's float32
rows are converted once per merge, here). Other backends (Triton) run the subtraction as a
second pass of their own op.

On a CPU the merged weights are built beside the live ones, a bounded piece per step boundary,
and swapped in by reference (model/staged_merge.py), so steps never wait for the whole merge;
elsewhere ``W`` is written in place. Either way unmerging restores the original weights bit for
bit (the originals swapped back by reference, or copied back from a host copy taken at merge
time), so the base model after an unmerge is exactly the model before the merge (no drift from
repeated add/subtract rounding in low precision).

A merge is refused (``MergeRefusedError``, nothing changed) when a module's delta ``s * B @ A`` is
more than ``MAX_DELTA_RATIO`` times the largest weight it is added to (checked on a bound from the
factors first; the product is computed only when the bound cannot clear it). NOTE: every other
token computes ``round(W + sBA) x - sBA x``, so the rounding of the merged weight is at the delta's
scale, not W's: an adapter with huge finite weights, harmless unmerged (it only spoils its own
requests), wiped the base weights out for every other tenant once merged (on the demo model, a
delta about 580 times the base weights flipped other tenants' greedy tokens in bfloat16, 5.8e5
times in float32; docs/benchmarks/attack23.md).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import torch

from loraplex.errors import LoraplexError
from loraplex.model.adapter_weights import AdapterWeights, ModuleWeights
from loraplex.model.buffers import ArenaReleases
from loraplex.model.layers import Linear
from loraplex.model.llama import LlamaModel
from loraplex.model.lora import LoraSlotPool
from loraplex.model.staged_merge import MergeStaging, StagedWeights
from loraplex.ops.base import LoraBatch, ModuleLoraWeights, Strategy
from loraplex.ops.merged_op import (
    FUSED_BACKENDS,
    FusedMergedBatch,
    apply_fused,
    fused_plan,
    negative_float32,
)
from loraplex.ops.plan import FLOAT32_MAX_TOKENS
from loraplex.ops.torch_ops import AutoBackend, Float32Pair

_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
# The largest merged delta accepted, as a multiple of the largest base weight of the module it
# is added to (max |s B A| / max |W|). The demo adapters reach 5.2; other tenants' greedy
# outputs on the demo model broke the bfloat16 parity rule from about 176 (docs/modes.md).
MAX_DELTA_RATIO = 32.0


class MergeStateError(LoraplexError):
    """A merge while merged, an unmerge while unmerged, or an action a merge forbids."""


class MergeRefusedError(LoraplexError):
    """An adapter whose merged delta would swamp the base weights: not merged (it stays served
    through the LoRA op, unmerged)."""


def negated(weights: AdapterWeights) -> AdapterWeights:
    """``weights`` with every module's scale negated (the delta to subtract); same tensors."""
    modules = tuple(replace(module, scale=-module.scale) for module in weights.modules)
    return AdapterWeights(weights.digest, weights.dtype, modules, weights.runs)


def linear_of(model: LlamaModel, layer: int, module: str) -> Linear:
    """The decoder's linear layer for ``(layer, module)``."""
    block = model.model.layers[layer]
    parent = block.self_attn if module in _ATTENTION else block.mlp
    found = getattr(parent, module)
    if not isinstance(found, Linear):
        raise ValueError(f"module {module!r} is invalid; expected a target module name")
    return found


class WeightMerger:
    """Folds one adapter into ``model``'s weights and restores them exactly.

    ``staged`` (the default on a CPU): the merged weights are built beside the live ones
    (:meth:`stage`, a bounded piece at a time, model/staged_merge.py) and swapped in by
    reference (:meth:`commit`); the unmerge swaps the originals back. Else in place (the
    default on other devices, where memory is scarce and a merge takes milliseconds): ``merge``
    writes ``W += s B A`` and keeps a host copy of each original W for the unmerge. ``clock``:
    seconds, what a staging's budget is counted in."""

    def __init__(
        self,
        model: LlamaModel,
        *,
        staged: bool | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.model = model
        self.staged = model.device.type == "cpu" if staged is None else staged
        self.clock = clock
        self._digest: str | None = None
        self._backup: dict[tuple[int, str], torch.Tensor] = {}  # in place: host copies of W
        self._swapped: StagedWeights | None = None  # staged: the weights swapped in
        # arenas of dropped merged weights, freed by pieces: the engine's ``release_step`` at
        # each step boundary, ``releases.drain()`` where no steps follow
        self.releases = ArenaReleases()
        # (layer, module) -> max |W| of the base weights (they come back bit for bit: read once)
        self._base_largest: dict[tuple[int, str], float] = {}

    @property
    def merged_digest(self) -> str | None:
        """Digest of the merged adapter; None when the weights are the base model's."""
        return self._digest

    def stage(self, weights: AdapterWeights) -> MergeStaging:
        """A staging of ``weights`` beside the live weights (nothing live changes until
        :meth:`commit`); its ``advance`` raises ``MergeRefusedError`` for a swamping delta."""
        if not self.staged:
            raise MergeStateError("this merger merges in place; expected merge(), not stage()")
        self._check_unmerged(weights)
        return MergeStaging(
            self.model,
            weights,
            functools.partial(linear_of, self.model),
            functools.partial(self._refuse_swamping, weights.digest),
            self.clock,
            releases=self.releases,
        )

    def commit(self, staging: MergeStaging) -> None:
        """Swap the fully staged weights in (the caller holds the slot lock): O(modules)."""
        self._check_unmerged(staging.weights)
        swapped = staging.result()
        swapped.swap_in()
        self._swapped, self._digest = swapped, staging.weights.digest

    def merge(self, weights: AdapterWeights) -> None:
        """``W += scale * B @ A`` for every module of ``weights`` (float32 math, model dtype):
        staged all at once and committed, or in place."""
        if self.staged:
            staging = self.stage(weights)
            staging.advance(math.inf)
            self.commit(staging)
            return
        self._check_unmerged(weights)
        backup: dict[tuple[int, str], torch.Tensor] = {}
        with torch.no_grad():
            try:
                for module in weights.modules:
                    key = (module.layer, module.module)
                    weight = linear_of(self.model, module.layer, module.module).weight
                    lora_a = module.lora_a.to(weight.device, torch.float32)
                    lora_b = module.lora_b.to(weight.device, torch.float32)
                    self._refuse_swamping(weights.digest, module, weight, lora_a, lora_b)
                    backup[key] = weight.detach().to("cpu", copy=True)
                    merged = weight.float().addmm_(lora_b, lora_a, alpha=module.scale)
                    weight.copy_(merged.to(weight.dtype))
            except MergeRefusedError:
                self._restore(backup)  # the modules written before the refused one
                raise
            self.model.prepack()  # the written weights' packed copies, now, not in a step
        self._backup = backup
        self._digest = weights.digest

    def unmerge(self, *, release_now: bool = True) -> None:
        """Put back the original weights of every module the merge touched. ``release_now``
        False: the merged weights' arena is left to ``releases`` (the engine frees it by pieces
        between steps); else it is freed before this returns, as their own buffers were."""
        if self._digest is None:
            raise MergeStateError("nothing is merged; expected a merge before an unmerge")
        if self._swapped is not None:
            self._swapped.swap_out()
            if self._swapped.arena is not None:  # NOTE: freed at once, it held the engine's
                self.releases.add(self._swapped.arena)  # steps 23-37 ms (large preset)
        else:
            with torch.no_grad():
                self._restore(self._backup)
        # the merged weights go (if nothing holds them); NOTE: no local may hold the arena past
        # here, or the releases read it as in use
        self._backup, self._swapped = {}, None
        self._digest = None
        if release_now:
            self.releases.drain()

    def _check_unmerged(self, weights: AdapterWeights) -> None:
        if self._digest is not None:
            raise MergeStateError(
                f"adapter {weights.digest[:12]} cannot be merged: {self._digest[:12]} is merged; "
                "expected an unmerge first"
            )

    def _refuse_swamping(
        self,
        digest: str,
        module: ModuleWeights,
        weight: torch.Tensor,
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
    ) -> None:
        """``MergeRefusedError`` when ``module``'s delta would swamp ``weight`` (float32
        factors); the bound first, the product only when the bound cannot clear it."""
        base = self._largest_base((module.layer, module.module), weight)
        bound = _delta_bound(lora_a, lora_b, module.scale)
        if not bound <= MAX_DELTA_RATIO * base:  # NaN too: multiply it out
            largest = abs(module.scale) * _largest(torch.mm(lora_b, lora_a))
            _check_delta(digest, module, largest, base)

    def _largest_base(self, key: tuple[int, str], weight: torch.Tensor) -> float:
        if key not in self._base_largest:
            self._base_largest[key] = _largest(weight)
        return self._base_largest[key]

    def _restore(self, backup: dict[tuple[int, str], torch.Tensor]) -> None:
        for (layer, module), original in backup.items():
            linear_of(self.model, layer, module).weight.copy_(original)
        self.model.prepack()


def _largest(tensor: torch.Tensor) -> float:
    """``max |tensor|``, NaN if any element is (``aminmax``: one pass, no ``abs`` copy)."""
    low, high = torch.aminmax(tensor)
    return float(torch.maximum(-low, high))


def _delta_bound(lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float) -> float:
    """An upper bound on ``max |scale B A|`` from the factors alone (Cauchy-Schwarz: each
    element is a row of B against a column of A), so an adapter well inside the limit costs
    its merge no product of its own; only one the bound cannot clear is multiplied out."""
    rows = torch.linalg.vector_norm(lora_b, dim=1).max()  # B: [d_out, rank]
    columns = torch.linalg.vector_norm(lora_a, dim=0).max()  # A: [rank, d_in]
    return abs(scale) * float(rows) * float(columns)


def _check_delta(
    digest: str, module: ModuleWeights, largest_delta: float, largest_base: float
) -> None:
    """``MergeRefusedError`` when ``largest_delta`` (``max |s B A|``) exceeds ``MAX_DELTA_RATIO``
    times ``largest_base`` (``max |W|`` of the module)."""
    if largest_delta <= MAX_DELTA_RATIO * largest_base:  # NaN fails (an overflowing product)
        return
    ratio = largest_delta / largest_base if largest_base > 0 else float("inf")
    raise MergeRefusedError(
        f"adapter {digest[:12]} cannot be merged: its delta on layer {module.layer} "
        f"{module.module} reaches {largest_delta:.3g}, {ratio:.3g} times the largest base "
        f"weight {largest_base:.3g}; expected at most {MAX_DELTA_RATIO:g} times (merged, the "
        "rounding of the base weights would spoil every other request's output); it stays "
        "served unmerged"
    )


@dataclass(frozen=True)
class MergedLoraBatch(LoraBatch):
    """A step's batch while an adapter is merged: the ordinary pass (merged tokens mapped to
    base-only) plus the pass subtracting the merged delta from every other token."""

    negative: LoraBatch | None = None  # the subtracting pass; None when no token needs it

    @property
    def adds_nothing(self) -> bool:
        return self.strategy is Strategy.NONE and self.negative is None


def negative_pool_for(pool: LoraSlotPool) -> LoraSlotPool:
    """A one-slot pool like ``pool`` (same backend, dtype, ranks) for the negative copy: kept
    apart from ``pool`` so the adapter cache's slots and budgets are untouched by a merge."""
    return LoraSlotPool(
        pool.spec,
        1,
        pool.max_lora_rank,
        dtype=pool.dtype,
        device=pool.device,
        backend=pool.backend.name,
        target_modules=pool.target_modules,
    )


def slot_weights(pool: LoraSlotPool, slot: int) -> AdapterWeights:
    """A copy of the adapter in ``slot`` read back from the pool's arenas (device tensors)."""
    info = pool.slot_info(slot)
    if info is None:
        raise MergeStateError(f"slot {slot} holds no adapter; expected a loaded slot to merge")
    modules = []
    for layer in range(pool.spec.num_layers):
        for module in pool.target_modules:
            view = pool.module_weights(layer, module)
            rows = view.slots[slot]
            if rows.rank == 0:
                continue
            span = slice(rows.start, rows.start + rows.rank)
            lora_a, lora_b = view.lora_a[span].clone(), view.lora_b[span].T.clone()
            modules.append(ModuleWeights(layer, module, lora_a, lora_b, rows.scale))
    return AdapterWeights(info.digest, pool.dtype, tuple(modules))


class MergedLoraApplier:
    """A :class:`~loraplex.model.llama.LoraApplier` over ``pool`` while ``merged_slot``'s adapter
    is folded into the weights; ``negative`` (one slot) holds that adapter at negative scale,
    unchanged while this applier is in use. ``float32_max_tokens``: most foreign tokens of a
    step run in float32 on a CPU with 16-bit weights (``auto`` backend; 0: never)."""

    def __init__(
        self,
        pool: LoraSlotPool,
        merged_slot: int,
        negative: LoraSlotPool,
        float32_max_tokens: int = FLOAT32_MAX_TOKENS,
    ) -> None:
        if negative.slot_info(0) is None:
            raise MergeStateError("negative pool slot 0 is empty; expected the negated adapter")
        if float32_max_tokens < 0:
            raise ValueError(f"float32_max_tokens {float32_max_tokens} is invalid; expected >= 0")
        self.pool = pool
        self.merged_slot = merged_slot
        self.negative = negative
        self.float32_max_tokens = float32_max_tokens
        self.fused = pool.backend.name in FUSED_BACKENDS and negative.backend.name in FUSED_BACKENDS
        self._last_strategy = "none"
        # (layer, module) -> the negative copy in float32, made on first use (float32 plans)
        self._negative32: dict[tuple[int, str], Float32Pair | None] = {}

    @property
    def last_strategy(self) -> str:
        """The strategy of the last prepared step, as traces report it (the primary pass's)."""
        return self._last_strategy if self.fused else self.pool.last_strategy

    def prepare(self, token_slots: torch.Tensor) -> LoraBatch:
        if token_slots.device != self.pool.device or token_slots.dtype != torch.int64:
            token_slots = token_slots.to(self.pool.device, torch.int64)
        if self.fused:
            backend = self.pool.backend
            policy = backend.policy if isinstance(backend, AutoBackend) else None
            plan = fused_plan(
                token_slots,
                self.merged_slot,
                self.pool.layout,
                backend.name,
                policy,
                float32_max_tokens=self.float32_max_tokens,
            )
            self._last_strategy = plan.strategy.value
            return plan
        merged = token_slots == self.merged_slot
        primary = self.pool.prepare(torch.where(merged, -1, token_slots))
        negative = None
        if not bool(merged.all()):
            negative = self.negative.prepare(torch.where(merged, -1, 0))
        values = {f.name: getattr(primary, f.name) for f in fields(LoraBatch)}
        return MergedLoraBatch(**values, negative=negative)

    def apply(
        self, layer: int, module: str, x: torch.Tensor, out: torch.Tensor, batch: LoraBatch
    ) -> torch.Tensor:
        if isinstance(batch, FusedMergedBatch):
            if not self.pool.targets(layer, module):
                return out
            negative = self.negative.module_weights(layer, module)
            negative32 = self._float32_of(layer, module, negative) if batch.float32 else None
            weights = self.pool.module_weights(layer, module)
            return apply_fused(x, out, weights, negative, batch, negative32=negative32)
        out = self.pool.apply(layer, module, x, out, batch)
        if isinstance(batch, MergedLoraBatch) and batch.negative is not None:
            out = self.negative.apply(layer, module, x, out, batch.negative)
        return out

    def _float32_of(
        self, layer: int, module: str, negative: ModuleLoraWeights
    ) -> Float32Pair | None:
        key = (layer, module)
        if key not in self._negative32:
            self._negative32[key] = negative_float32(negative)
        return self._negative32[key]
