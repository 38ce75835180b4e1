"""The merged step's op (ops/merged_op.py) against its definition, swept over popularity
patterns: every token not on the merged slot gets its own adapter's delta minus the merged
one's, the merged slot's tokens get nothing; grouped runs in place or gathered, masked."""

from __future__ import annotations

import random

import pytest
import torch
from test_backends import MODULES, SPEC, expected_delta, filled_pool, make_weights

from loraplex.model.adapter_weights import AdapterWeights
from loraplex.model.lora import LoraSlotPool
from loraplex.model.merge import MergedLoraApplier, negated, negative_pool_for, slot_weights
from loraplex.ops.base import Strategy
from loraplex.ops.merged_op import FusedMergedBatch, apply_fused, fused_plan

MERGED = 2  # the merged slot (rank 16 in the S2 mix)
RANKS = [64, 32, 16, 8, 64, 32, 16, 8]


def slots_of(pattern: str, rng: random.Random) -> list[int]:
    """20 decode tokens (or 4 prefill chunks of 5) with the merged slot's share as named."""
    if pattern == "skewed80":  # 16 merged, 4 foreign on distinct slots, shuffled
        slots = [MERGED] * 16 + rng.sample([0, 1, 3, 4, 5, 6, 7], 4)
    elif pattern == "skewed80_repeat":  # a foreign slot twice, split by merged tokens
        slots = [MERGED] * 16 + [5, 5, 1, -1]
    elif pattern == "prefill":  # one chunk per sequence: every slot's tokens already one run
        return [s for s in (MERGED, 4, -1, 7) for _ in range(5)]
    elif pattern == "uniform":
        slots = [rng.randrange(-1, 8) for _ in range(20)]
    elif pattern == "base_only_foreign":
        slots = [MERGED] * 17 + [-1] * 3
    else:  # all merged: no LoRA work
        return [MERGED] * 20
    rng.shuffle(slots)
    return slots


def merged_delta(
    x: torch.Tensor,
    slots: list[int],
    adapters: list[AdapterWeights],
    layer: int,
    module: str,
    d_out: int,
) -> torch.Tensor:
    """The definition in float64: own delta minus the merged delta, nothing on merged tokens."""
    foreign = [-1 if s == MERGED else MERGED for s in slots]
    own = [-1 if s == MERGED else s for s in slots]
    return expected_delta(x, own, adapters, layer, module, d_out) - expected_delta(
        x, foreign, adapters, layer, module, d_out
    )


@pytest.mark.parametrize("backend", ["grouped", "masked", "auto"])
@pytest.mark.parametrize(
    "pattern",
    ["skewed80", "skewed80_repeat", "prefill", "uniform", "base_only_foreign", "all_merged"],
)
def test_fused_pass_matches_definition(backend: str, pattern: str) -> None:
    pool, adapters = filled_pool(backend, RANKS)
    negative: LoraSlotPool = negative_pool_for(pool)
    negative.load(0, negated(slot_weights(pool, MERGED)))
    slots = slots_of(pattern, random.Random(pattern))
    token_slots = torch.tensor(slots, dtype=torch.int64)
    plan = fused_plan(token_slots, MERGED, pool.layout, backend)
    gen = torch.Generator().manual_seed(7)
    for layer in range(SPEC.num_layers):
        for module in MODULES:
            d_in, d_out = SPEC.module_shape(module)
            x = torch.randn(len(slots), d_in, generator=gen)
            base = torch.randn(len(slots), d_out, generator=gen)
            out = base.clone()
            if isinstance(plan, FusedMergedBatch):
                weights = pool.module_weights(layer, module)
                out = apply_fused(x, out, weights, negative.module_weights(layer, module), plan)
            want = base.double() + merged_delta(x, slots, adapters, layer, module, d_out)
            torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    ("pattern", "in_place"),
    [
        ("skewed80", True),
        ("prefill", True),
        ("base_only_foreign", True),
        ("skewed80_repeat", False),
    ],
)
def test_grouped_runs_in_place_when_each_slot_is_one_run(pattern: str, in_place: bool) -> None:
    """No gather of the own-adapter pass when each foreign slot's tokens are one run already;
    a slot split by other tokens is gathered and sorted (one run per slot)."""
    pool, _ = filled_pool("grouped", RANKS)
    slots = slots_of(pattern, random.Random(pattern))
    plan = fused_plan(torch.tensor(slots), MERGED, pool.layout, "grouped")
    assert isinstance(plan, FusedMergedBatch) and plan.foreign is not None
    assert (plan.order is None) == in_place
    assert sorted(plan.foreign.tolist()) == [t for t, s in enumerate(slots) if s != MERGED]
    assert len(plan.segments) == len({s for s in slots if s not in (MERGED, -1)})


def test_an_all_merged_cpu_step_is_planned_on_the_host_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool = LoraSlotPool(SPEC, 8, 16, dtype=torch.float32, device=torch.device("cpu"))

    def no_device_scan(*args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError("torch.nonzero ran on an all-merged step")

    monkeypatch.setattr(torch, "nonzero", no_device_scan)
    for slots in ([MERGED] * 20, [MERGED]):
        plan = fused_plan(torch.tensor(slots), MERGED, pool.layout, "grouped")
        assert plan.strategy is Strategy.NONE and plan.adds_nothing
        assert plan.num_tokens == len(slots)
    with pytest.raises(AssertionError, match="nonzero"):  # a foreign token: the full plan
        fused_plan(torch.tensor([MERGED] * 19 + [1]), MERGED, pool.layout, "grouped")


def stored_pool(dtype: torch.dtype) -> tuple[LoraSlotPool, LoraSlotPool, list[AdapterWeights]]:
    """An ``auto`` pool of ``dtype`` with the RANKS mix, its negative copy of MERGED, and every
    adapter as the arena stores it (rounded to ``dtype``: the definition's weights)."""
    pool = LoraSlotPool(SPEC, len(RANKS), 64, dtype=dtype, device=torch.device("cpu"))
    for slot, rank in enumerate(RANKS):
        pool.load(slot, make_weights(rank, slot))
    stored = [slot_weights(pool, slot) for slot in range(len(RANKS))]
    negative = negative_pool_for(pool)
    negative.load(0, negated(stored[MERGED]))
    return pool, negative, stored


def worst_relative_error(
    pool: LoraSlotPool,
    negative: LoraSlotPool,
    stored: list[AdapterWeights],
    slots: list[int],
    plan: FusedMergedBatch,
) -> float:
    """The largest ``|got - want| / |want|`` over every module (``want``: the definition in
    float64); merged tokens' rows must come back untouched."""
    gen = torch.Generator().manual_seed(11)
    dtype, worst = pool.dtype, 0.0
    merged_rows = torch.tensor([s == MERGED for s in slots])
    for layer in range(SPEC.num_layers):
        for module in MODULES:
            d_in, d_out = SPEC.module_shape(module)
            x = torch.randn(len(slots), d_in, generator=gen).to(dtype)
            base = torch.randn(len(slots), d_out, generator=gen).to(dtype)
            weights, neg = (
                pool.module_weights(layer, module),
                negative.module_weights(layer, module),
            )
            got = apply_fused(x, base.clone(), weights, neg, plan).double()
            want = base.double() + merged_delta(x, slots, stored, layer, module, d_out)
            assert torch.equal(got[merged_rows], base.double()[merged_rows])
            worst = max(worst, float(((got - want).abs() / want.abs()).max()))
    return worst


@pytest.mark.parametrize(
    ("dtype", "unit_roundoff"), [(torch.bfloat16, 2**-8), (torch.float16, 2**-11)]
)
@pytest.mark.parametrize("pattern", ["skewed80", "skewed80_repeat", "prefill", "base_only_foreign"])
def test_a_16bit_cpu_step_with_few_foreign_tokens_runs_in_float32(
    dtype: torch.dtype, unit_roundoff: float, pattern: str
) -> None:
    """16-bit weights on a CPU, ``auto``, at most FLOAT32_MAX_TOKENS foreign tokens: the whole
    gathered pass (own runs and the negative copy) is computed in float32 and rounded once, so
    every foreign row is the definition rounded to the dtype (within its unit roundoff, plus
    float32's own error), closer than the same step computed in the dtype."""
    pool, negative, stored = stored_pool(dtype)
    slots = slots_of(pattern, random.Random(pattern))
    token_slots = torch.tensor(slots)
    plan = fused_plan(token_slots, MERGED, pool.layout, "auto")
    half = fused_plan(token_slots, MERGED, pool.layout, "auto", float32_max_tokens=0)
    assert isinstance(plan, FusedMergedBatch) and plan.float32
    assert isinstance(half, FusedMergedBatch) and not half.float32
    float32_error = worst_relative_error(pool, negative, stored, slots, plan)
    assert float32_error <= unit_roundoff * 1.001
    assert float32_error < worst_relative_error(pool, negative, stored, slots, half)


def test_float32_is_chosen_by_auto_on_16bit_cpu_weights_up_to_the_token_cap() -> None:
    """Forced masked/grouped keep their computation; float32 weights never need the pass; more
    foreign tokens than the cap (bfloat16 matmuls amortise their per-call cost) keep the dtype."""
    pool, _, _ = stored_pool(torch.bfloat16)
    float32_pool, _ = filled_pool("auto", RANKS)
    few = torch.tensor([MERGED] * 4 + [0, 1, 3, 4] * 4)  # 16 foreign tokens
    many = torch.tensor([MERGED] * 4 + [0, 1, 3, 4] * 4 + [5])  # 17

    def is_float32(plan: object) -> bool:
        return isinstance(plan, FusedMergedBatch) and plan.float32

    assert is_float32(fused_plan(few, MERGED, pool.layout, "auto"))
    assert not is_float32(fused_plan(many, MERGED, pool.layout, "auto"))
    assert is_float32(fused_plan(many, MERGED, pool.layout, "auto", float32_max_tokens=17))
    assert not is_float32(fused_plan(few, MERGED, float32_pool.layout, "auto"))
    for backend in ("masked", "grouped"):
        assert not is_float32(fused_plan(few, MERGED, pool.layout, backend))


def test_the_merged_applier_keeps_the_negative_copy_in_float32_once() -> None:
    pool, negative, _ = stored_pool(torch.bfloat16)
    with pytest.raises(ValueError, match="float32_max_tokens -1 is invalid"):
        MergedLoraApplier(pool, MERGED, negative, float32_max_tokens=-1)
    applier = MergedLoraApplier(pool, MERGED, negative)
    slots = slots_of("skewed80", random.Random(0))
    batch = applier.prepare(torch.tensor(slots))
    assert isinstance(batch, FusedMergedBatch) and batch.float32
    x, out = torch.randn(20, 48).to(torch.bfloat16), torch.zeros(20, 48, dtype=torch.bfloat16)
    want = apply_fused(x, out.clone(), pool.module_weights(0, "q_proj"),
                       negative.module_weights(0, "q_proj"), batch)  # fmt: skip
    for _ in range(2):
        assert torch.equal(applier.apply(0, "q_proj", x, out.clone(), batch), want)
    kept = applier._negative32[(0, "q_proj")]
    assert kept is not None and kept[0].dtype == torch.float32
    assert list(applier._negative32) == [(0, "q_proj")]
    off = MergedLoraApplier(pool, MERGED, negative, float32_max_tokens=0).prepare(
        torch.tensor(slots)
    )
    assert isinstance(off, FusedMergedBatch) and not off.float32
