"""The unmerged ``auto`` op's float32 pass (ops/torch_ops.py, ``apply_float32``): on a CPU with
16-bit weights, a grouped step of two runs or more with at most FLOAT32_MAX_TOKENS adapter
tokens is gathered, computed in float32 and rounded once: the token rule the merged op applies
to its foreign tokens (plan.py, ``runs_in_float32``). The tiny model's steps are masked under
the default policy, so most tests run a policy that never picks masked (``GROUPED``)."""

from __future__ import annotations

import random

import pytest
import torch
from test_backends import MODULES, NUM_SLOTS, RANK_MIXES, SPEC, expected_delta, make_weights

from loraplex.model.adapter_weights import AdapterWeights
from loraplex.model.lora import LoraSlotPool
from loraplex.model.merge import slot_weights
from loraplex.ops import AutoPolicy, LoraBackend, LoraBatch, Strategy
from loraplex.ops.plan import FLOAT32_MAX_TOKENS
from loraplex.ops.reference import ReferenceBackend
from loraplex.ops.torch_ops import AutoBackend

GROUPED = AutoPolicy(min_runs_for_masked=NUM_SLOTS + 1)  # every step grouped
UNIT_ROUNDOFF = {torch.bfloat16: 2**-8, torch.float16: 2**-11, torch.float32: 2**-24}


def stored_pool(
    dtype: torch.dtype, backend: str = "auto"
) -> tuple[LoraSlotPool, list[AdapterWeights]]:
    """A pool of ``dtype`` with the S2 rank mix, and every adapter as the arena stores it
    (rounded to ``dtype``: the definition's weights)."""
    pool = LoraSlotPool(
        SPEC, NUM_SLOTS, 64, dtype=dtype, device=torch.device("cpu"), backend=backend
    )
    for slot, rank in enumerate(RANK_MIXES["S2"]):
        pool.load(slot, make_weights(rank, slot))
    return pool, [slot_weights(pool, slot) for slot in range(NUM_SLOTS)]


def slots_of(pattern: str, rng: random.Random) -> list[int]:
    """A decode step of at most FLOAT32_MAX_TOKENS adapter tokens (base-only ones beside)."""
    if pattern == "skewed80":  # 16 sequences, 13 on one slot, 3 on others, shuffled
        slots = [2] * 13 + rng.sample([0, 1, 3, 4, 5, 6, 7], 3)
    elif pattern == "distinct":
        slots = list(range(NUM_SLOTS))
    elif pattern == "repeat_scattered":  # a slot twice, split by others, and base-only tokens
        slots = [5, 1, 5, -1, 1, -1]
    else:  # 16 adapter tokens among 20 (the base-only four do not count)
        slots = [rng.randrange(NUM_SLOTS) for _ in range(FLOAT32_MAX_TOKENS)] + [-1] * 4
    rng.shuffle(slots)
    return slots


def outputs(
    pool: LoraSlotPool, backend: LoraBackend, batch: LoraBatch, slots: list[int]
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per (layer, module): ``(x, base, got)`` with ``got`` ``backend``'s output on ``base``."""
    gen = torch.Generator().manual_seed(7)
    results = []
    for layer in range(SPEC.num_layers):
        for module in MODULES:
            d_in, d_out = SPEC.module_shape(module)
            x = torch.randn(len(slots), d_in, generator=gen).to(pool.dtype)
            base = torch.randn(len(slots), d_out, generator=gen).to(pool.dtype)
            weights = pool.module_weights(layer, module)
            results.append((x, base, backend.apply(x, base.clone(), weights, batch)))
    return results


def worst_relative_error(
    pool: LoraSlotPool,
    backend: LoraBackend,
    stored: list[AdapterWeights],
    slots: list[int],
    batch: LoraBatch,
) -> float:
    """The largest ``|got - want| / |want|`` over every module (``want``: the definition in
    float64 on the stored weights; ``|want|`` at least 2^-9 of its row's largest and the
    dtype's smallest normal, below which rounding is absolute); base-only tokens' rows must
    come back untouched."""
    worst = 0.0
    plain = torch.tensor([s < 0 for s in slots])
    where = [(layer, module) for layer in range(SPEC.num_layers) for module in MODULES]
    got_all = outputs(pool, backend, batch, slots)
    for (layer, module), (x, base, got) in zip(where, got_all, strict=True):
        want = base.double() + expected_delta(x, slots, stored, layer, module, got.shape[1])
        assert torch.equal(got[plain], base[plain])
        # an element far below its row's largest (base and delta nearly cancelling) carries
        # float32's own rounding of the large terms: judged against 2^-9 of the row's largest
        floor = want.abs().amax(dim=1, keepdim=True) * 2**-9
        scale = torch.maximum(want.abs(), floor).clamp(min=torch.finfo(pool.dtype).tiny)
        worst = max(worst, float(((got.double() - want).abs() / scale).max()))
    return worst


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("pattern", ["skewed80", "distinct", "repeat_scattered", "cap"])
def test_auto_matches_the_reference_within_the_dtypes_tolerance(
    dtype: torch.dtype, pattern: str
) -> None:
    """``auto`` (the float32 pass on 16-bit weights, the dtype's own path on float32 ones)
    against the reference loop on the same pool, per token relative to its delta's norm: within
    2 % in 16-bit dtypes (the op's bfloat16 standard, test_backends), 1e-5 in float32."""
    pool, _ = stored_pool(dtype)
    slots = slots_of(pattern, random.Random(pattern))
    token_slots = torch.tensor(slots)
    auto, reference = AutoBackend(GROUPED), ReferenceBackend()
    batch = auto.prepare(token_slots, pool.layout)
    assert batch.float32 is (dtype != torch.float32)
    adapted = [t for t, s in enumerate(slots) if s >= 0]
    tolerance = 1e-5 if dtype == torch.float32 else 0.02
    ours = outputs(pool, auto, batch, slots)
    theirs = outputs(pool, reference, reference.prepare(token_slots, pool.layout), slots)
    for (_, base, got), (_, _, want) in zip(ours, theirs, strict=True):
        delta = (want.double() - base.double())[adapted]
        error = (got.double() - want.double())[adapted].norm(dim=1) / delta.norm(dim=1)
        assert error.max().item() < tolerance, error


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pattern", ["skewed80", "distinct", "repeat_scattered", "cap"])
def test_the_float32_pass_is_the_definition_rounded_once(dtype: torch.dtype, pattern: str) -> None:
    """Every adapter token's row is the definition (float64, stored weights) rounded to the
    dtype once: within the dtype's unit roundoff, and closer than the same step in the dtype."""
    pool, stored = stored_pool(dtype)
    slots = slots_of(pattern, random.Random(pattern))
    token_slots = torch.tensor(slots)
    auto, off = AutoBackend(GROUPED), AutoBackend(GROUPED, float32_max_tokens=0)
    plan, half = auto.prepare(token_slots, pool.layout), off.prepare(token_slots, pool.layout)
    assert plan.float32 and not half.float32
    assert plan.strategy is half.strategy is Strategy.GROUPED
    float32_error = worst_relative_error(pool, auto, stored, slots, plan)
    assert float32_error <= UNIT_ROUNDOFF[dtype] * 1.001
    assert float32_error < worst_relative_error(pool, off, stored, slots, half)


def test_float32_is_chosen_on_16bit_cpu_grouped_steps_per_run() -> None:
    """``auto`` on 16-bit CPU weights takes the float32 pass on a grouped step of two runs or
    more when some run has at most FLOAT32_MAX_TOKENS tokens (base-only ones not counted),
    however many the step has: runs above the cap stay in the dtype (``dtype_runs``); one run,
    no short run, a masked step (the default policy's choice on the tiny model where bfloat16
    is native), float32
    weights, forced backends and ``float32_max_tokens=0`` never take it."""
    pool, _ = stored_pool(torch.bfloat16)
    float32_pool, _ = stored_pool(torch.float32)
    cap = [0, 1, 3, 4] * 4  # 16 adapter tokens
    few = torch.tensor(cap + [-1] * 4)
    many = torch.tensor([*cap, 5] * 2)  # 34 adapter tokens in runs of 8 and 2
    auto = AutoBackend(GROUPED)
    batch = auto.prepare(few, pool.layout)
    assert batch.float32 and batch.strategy is Strategy.GROUPED and not batch.dtype_runs
    assert batch.order is not None and sorted(batch.order.tolist()) == list(range(16))
    assert [(s.slot, s.end - s.start) for s in batch.segments] == [(0, 4), (1, 4), (3, 4), (4, 4)]
    assert auto.prepare(many, pool.layout).float32
    long = torch.tensor([3] * (FLOAT32_MAX_TOKENS + 1) + [0, 5, -1])
    mixed = auto.prepare(long, pool.layout)
    assert mixed.float32 and mixed.dtype_runs == {3}
    both_long = torch.tensor([3, 5] * (FLOAT32_MAX_TOKENS + 1))
    assert not auto.prepare(both_long, pool.layout).float32
    assert AutoBackend(GROUPED, float32_max_tokens=17).prepare(both_long, pool.layout).float32
    assert not AutoBackend(GROUPED, float32_max_tokens=0).prepare(few, pool.layout).float32
    assert not auto.prepare(few, float32_pool.layout).float32
    one_run = auto.prepare(torch.tensor([3, 3, -1, 3]), pool.layout)
    assert one_run.strategy is Strategy.GROUPED and not one_run.float32
    # the default policy, with the costs of a CPU with native bfloat16 (this test's CPU may
    # lack it, where this step goes grouped: test_bfloat16_emulated.py)
    masked = AutoBackend(bfloat16_emulated=False).prepare(few, pool.layout)
    assert masked.strategy is Strategy.MASKED and not masked.float32
    for backend in ("masked", "grouped", "batched"):
        forced, _ = stored_pool(torch.bfloat16, backend)
        assert not forced.prepare(few).float32
    assert auto.prepare(torch.tensor([-1, -1]), pool.layout).strategy is Strategy.NONE
    with pytest.raises(ValueError, match="float32_max_tokens -1 is invalid"):
        AutoBackend(float32_max_tokens=-1)


def test_a_long_run_stays_in_the_dtype_and_the_short_ones_round_once() -> None:
    """In a step with a run above the cap, the short runs' rows are exactly those of the pass
    with every run in float32 (within the unit roundoff of the definition); the long run's are
    not (its matmuls round in bfloat16), and are within the op's 2 % of the reference."""
    pool, stored = stored_pool(torch.bfloat16)
    slots = [2] * (FLOAT32_MAX_TOKENS + 4) + [0, 5, 7, -1]
    random.Random(3).shuffle(slots)
    token_slots = torch.tensor(slots)
    auto = AutoBackend(GROUPED)
    batch = auto.prepare(token_slots, pool.layout)
    assert batch.float32 and batch.dtype_runs == {2}
    every = LoraBatch(**{**batch.__dict__, "dtype_runs": frozenset()})
    long = torch.tensor([s == 2 for s in slots])
    short = torch.tensor([s >= 0 and s != 2 for s in slots])
    differs = 0
    for (_, _, got), (_, _, f32) in zip(
        outputs(pool, auto, batch, slots), outputs(pool, auto, every, slots), strict=True
    ):
        assert torch.equal(got[short], f32[short])
        differs += int(not torch.equal(got[long], f32[long]))
    assert differs > 0
    reference = ReferenceBackend()
    theirs = outputs(pool, reference, reference.prepare(token_slots, pool.layout), slots)
    for (_, base, got), (_, _, want) in zip(outputs(pool, auto, batch, slots), theirs, strict=True):
        delta = (want.double() - base.double())[long]
        error = (got.double() - want.double())[long].norm(dim=1) / delta.norm(dim=1)
        assert error.max().item() < 0.02, error
    assert worst_relative_error(pool, auto, stored, slots, every) <= 2**-8 * 1.001


def test_a_float32_batch_without_its_gathered_tokens_is_refused() -> None:
    pool, _ = stored_pool(torch.bfloat16)
    auto = AutoBackend(GROUPED)
    batch = auto.prepare(torch.tensor([1, 2]), pool.layout)
    assert batch.float32
    broken = LoraBatch(**{**batch.__dict__, "order": None})
    x, out = torch.zeros(2, 48, dtype=torch.bfloat16), torch.zeros(2, 48, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="float32 batch needs its gathered tokens"):
        auto.apply(x, out, pool.module_weights(0, "q_proj"), broken)
