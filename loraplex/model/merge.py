"""Merged execution: one adapter folded into the base weights, the others still batched.

While an adapter is merged (``W' = W + s * B @ A`` on every (layer, module) it targets, computed
in float32 and stored in the model's dtype), its tokens need no LoRA work at all. Every other
token (another adapter's, or the base model's) gets the merged delta taken back out through the
same batched LoRA op: a second slot holds the same adapter at negative scale (a one-slot pool of
its own, so the adapter cache's slots and byte budgets are not touched), applied to every
non-merged token. Mixed batches therefore keep working and nothing is refused.

With the torch backends the subtraction rides the grouped pass itself (:func:`fused_batch`):
the non-merged tokens are gathered once, sorted by slot, each run gets its own adapter's
matmul pair and all of them one more pair with the negative copy, and the sum is scattered
back once. Against the unmerged grouped pass that is the same number of launches (the merged
revision's run is gone, the negative pair takes its place) over fewer tokens: the merged
revision's tokens cost no LoRA work and no gather at all. Other backends (Triton) run the
subtraction as a second pass of their own op.

Unmerging restores the original weights from a host copy taken at merge time, bit for bit, so
the base model after an unmerge is exactly the model before the merge (no drift from repeated
add/subtract rounding in low precision).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from loraplex.errors import LoraplexError
from loraplex.model.adapter_weights import AdapterWeights, ModuleWeights
from loraplex.model.layers import Linear
from loraplex.model.llama import LlamaModel
from loraplex.model.lora import LoraSlotPool
from loraplex.ops.base import LoraBatch, ModuleLoraWeights, Strategy
from loraplex.ops.plan import active_slots, active_tables, bits_of, none_batch, segments_of

# Backends whose grouped computation is plain torch ops: the negative pass can ride it.
FUSED_BACKENDS = frozenset({"auto", "grouped", "masked"})

_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


class MergeStateError(LoraplexError):
    """A merge while merged, an unmerge while unmerged, or an action a merge forbids."""


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
    """Folds one adapter into ``model``'s weights in place and restores them exactly."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self._digest: str | None = None
        self._backup: dict[tuple[int, str], torch.Tensor] = {}  # host copies of original W

    @property
    def merged_digest(self) -> str | None:
        """Digest of the merged adapter; None when the weights are the base model's."""
        return self._digest

    def merge(self, weights: AdapterWeights) -> None:
        """``W += scale * B @ A`` for every module of ``weights`` (float32 math, model dtype)."""
        if self._digest is not None:
            raise MergeStateError(
                f"adapter {weights.digest[:12]} cannot be merged: {self._digest[:12]} is merged; "
                "expected an unmerge first"
            )
        backup: dict[tuple[int, str], torch.Tensor] = {}
        with torch.no_grad():
            for module in weights.modules:
                weight = linear_of(self.model, module.layer, module.module).weight
                backup[(module.layer, module.module)] = weight.detach().to("cpu", copy=True)
                lora_a = module.lora_a.to(weight.device, torch.float32)
                lora_b = module.lora_b.to(weight.device, torch.float32)
                merged = weight.float().addmm_(lora_b, lora_a, alpha=module.scale)
                weight.copy_(merged.to(weight.dtype))
        self._backup = backup
        self._digest = weights.digest

    def unmerge(self) -> None:
        """Put back the original weights of every module the merge touched."""
        if self._digest is None:
            raise MergeStateError("nothing is merged; expected a merge before an unmerge")
        with torch.no_grad():
            for (layer, module), original in self._backup.items():
                linear_of(self.model, layer, module).weight.copy_(original)
        self._backup = {}
        self._digest = None


@dataclass(frozen=True)
class MergedLoraBatch(LoraBatch):
    """A step's batch while an adapter is merged: the ordinary pass (merged tokens mapped to
    base-only) plus the pass subtracting the merged delta from every other token."""

    negative: LoraBatch | None = None  # the subtracting pass; None when no token needs it
    # fused (torch backends): ``order``/``segments`` gather every non-merged token (base-only
    # ones too) and ``apply`` adds the negative copy's delta to all of them in the same pass
    fused: bool = False


def fused_batch(token_slots: torch.Tensor, merged_slot: int, pool: LoraSlotPool) -> LoraBatch:
    """The grouped plan of a merged step: every token not on ``merged_slot`` (base-only tokens
    included: they need the merged delta taken out too) in one gather sorted by slot, a run per
    active adapter slot; NONE when every token is the merged revision's."""
    others = torch.nonzero(token_slots != merged_slot).flatten()
    if others.numel() == 0:
        return MergedLoraBatch(**_fields(none_batch(token_slots)))
    order = others[torch.argsort(token_slots[others], stable=True)]
    slots = [s for s in active_slots(token_slots[others], pool.layout) if s != merged_slot]
    bits = bits_of(slots)
    return MergedLoraBatch(
        token_slots,
        int(token_slots.numel()),
        Strategy.GROUPED,
        active_bits=bits,
        segments=segments_of(token_slots[order], bits),
        order=order,
        active_tables=active_tables(pool.layout, bits),
        fused=True,
    )


def apply_fused(
    x: torch.Tensor,
    out: torch.Tensor,
    weights: ModuleLoraWeights,
    negative: ModuleLoraWeights,
    batch: LoraBatch,
) -> torch.Tensor:
    """``out[t] += delta_{slot(t)}(x[t]) - delta_merged(x[t])`` for every token ``t`` in
    ``batch.order``; one gather, one scatter."""
    order = batch.order
    if order is None:
        raise ValueError("a fused merged batch needs its gather order; expected fused_batch output")
    source = x.index_select(0, order)
    target = out.new_zeros((order.numel(), out.shape[1]))
    for segment in batch.segments:
        rows = weights.slots[segment.slot]
        if rows.rank == 0:
            continue
        lora_a = weights.lora_a[rows.start : rows.start + rows.rank]
        lora_b_t = weights.lora_b[rows.start : rows.start + rows.rank]
        hidden = torch.mm(source[segment.start : segment.end], lora_a.T)
        target[segment.start : segment.end].addmm_(hidden, lora_b_t, alpha=rows.scale)
    rows = negative.slots[0]
    if rows.rank:
        span = slice(rows.start, rows.start + rows.rank)
        hidden = torch.mm(source, negative.lora_a[span].T)
        target.addmm_(hidden, negative.lora_b[span], alpha=rows.scale)
    return out.index_add_(0, order, target)


def _fields(batch: LoraBatch) -> dict[str, Any]:
    return {f.name: getattr(batch, f.name) for f in fields(LoraBatch)}


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
    is folded into the weights; ``negative`` (one slot) holds that adapter at negative scale."""

    def __init__(self, pool: LoraSlotPool, merged_slot: int, negative: LoraSlotPool) -> None:
        if negative.slot_info(0) is None:
            raise MergeStateError("negative pool slot 0 is empty; expected the negated adapter")
        self.pool = pool
        self.merged_slot = merged_slot
        self.negative = negative
        self.fused = pool.backend.name in FUSED_BACKENDS and negative.backend.name in FUSED_BACKENDS
        self._last_strategy = "none"

    @property
    def last_strategy(self) -> str:
        """The strategy of the last prepared step, as traces report it (the primary pass's)."""
        return self._last_strategy if self.fused else self.pool.last_strategy

    def prepare(self, token_slots: torch.Tensor) -> LoraBatch:
        token_slots = token_slots.to(self.pool.device, torch.int64)
        if self.fused:
            batch = fused_batch(token_slots, self.merged_slot, self.pool)
            self._last_strategy = batch.strategy.value
            return batch
        merged = token_slots == self.merged_slot
        primary = self.pool.prepare(torch.where(merged, -1, token_slots))
        negative = None
        if not bool(merged.all()):
            negative = self.negative.prepare(torch.where(merged, -1, 0))
        return MergedLoraBatch(**_fields(primary), negative=negative)

    def apply(
        self, layer: int, module: str, x: torch.Tensor, out: torch.Tensor, batch: LoraBatch
    ) -> torch.Tensor:
        if isinstance(batch, MergedLoraBatch) and batch.fused:
            if not self.pool.targets(layer, module):
                return out
            return apply_fused(
                x,
                out,
                self.pool.module_weights(layer, module),
                self.negative.module_weights(layer, module),
                batch,
            )
        out = self.pool.apply(layer, module, x, out, batch)
        if isinstance(batch, MergedLoraBatch) and batch.negative is not None:
            out = self.negative.apply(layer, module, x, out, batch.negative)
        return out
