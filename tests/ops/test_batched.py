"""The batched computation: equal-rank slots' row blocks in one batched matmul pair, checked
against the per-token definition on shuffled rows, base rows, padded and unused blocks, partial
target modules and per-module scales; and when ``auto`` picks it."""

from __future__ import annotations

import random

import pytest
import torch
from test_backends import SPEC, expected_delta, filled_pool, run_all_modules

from loraplex.artifacts.base_model import TARGET_MODULES, BaseModelSpec
from loraplex.bench.workloads import S2_RANKS
from loraplex.demo.presets import get_preset
from loraplex.model.adapter_weights import AdapterWeights, ModuleWeights
from loraplex.model.lora import LoraSlotPool
from loraplex.ops import AutoBackend, AutoPolicy, Strategy
from loraplex.ops.base import MAX_STRIDED_VIEWS, ArenaLayout, BlockGroup, BlockPlan, SlotRows
from loraplex.ops.batched_plan import rank_classes
from loraplex.ops.policy import StepShape

EQUAL_RANKS = [16] * 8


def weights_on(modules: tuple[str, ...], rank: int, seed: int, scale: float) -> AdapterWeights:
    """A rank-``rank`` adapter on ``modules`` of both layers, one scale everywhere."""
    gen = torch.Generator().manual_seed(seed)
    pairs = []
    for layer in range(SPEC.num_layers):
        for module in modules:
            d_in, d_out = SPEC.module_shape(module)
            lora_a = torch.randn(rank, d_in, generator=gen)
            lora_b = torch.randn(d_out, rank, generator=gen)
            pairs.append(ModuleWeights(layer, module, lora_a, lora_b, scale))
    return AdapterWeights(f"{seed + 100:064x}", torch.float32, tuple(pairs))


def pool_of(adapters: list[AdapterWeights], backend: str = "batched") -> LoraSlotPool:
    pool = LoraSlotPool(SPEC, len(adapters), 64, dtype=torch.float32, device=torch.device("cpu"),
                        backend=backend)  # fmt: skip
    for slot, weights in enumerate(adapters):
        pool.load(slot, weights)
    return pool


@pytest.mark.parametrize("seed", range(6))
def test_shuffled_rows_with_base_rows_equal_the_definition(seed: int) -> None:
    pool, adapters = filled_pool("batched", EQUAL_RANKS)
    rng = random.Random(seed)
    slots = [rng.randrange(-1, 8) for _ in range(rng.randrange(3, 24))]
    slots[0] = rng.randrange(8)  # at least one adapter token
    batch = pool.prepare(torch.tensor(slots))
    assert batch.strategy is Strategy.BATCHED
    run_all_modules(pool, adapters, slots, seed=seed)


def test_tokens_in_block_order_are_read_in_place_and_base_rows_may_trail() -> None:
    pool, adapters = filled_pool("batched", EQUAL_RANKS)
    slots = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, -1, -1]
    batch = pool.prepare(torch.tensor(slots))
    assert batch.grid is not None
    assert (batch.grid.num_blocks, batch.grid.tokens_per_block) == (8, 2)
    assert batch.grid.tokens is None and batch.grid.positions is None  # no gather
    run_all_modules(pool, adapters, slots, seed=7)


def test_scattered_tokens_are_placed_in_their_blocks() -> None:
    pool, _ = filled_pool("batched", EQUAL_RANKS)
    batch = pool.prepare(torch.tensor([5, -1, 2, 5, 2, 2]))
    plan = batch.grid
    assert plan is not None and plan.tokens is not None and plan.positions is not None
    # slots 2 and 5 span blocks 0..3 (1 and 2 unused); the most tokens a slot has is 3
    assert (plan.num_blocks, plan.tokens_per_block) == (4, 3)
    assert plan.tokens.tolist() == [0, 2, 3, 4, 5]
    assert plan.positions.tolist() == [9, 0, 10, 1, 2]


def test_partial_target_modules_and_untargeted_slots_add_only_their_own() -> None:
    adapters = [
        weights_on(("q_proj",), 8, seed=0, scale=2.0),
        weights_on(("q_proj", "k_proj"), 8, seed=1, scale=2.0),
        weights_on(("down_proj",), 8, seed=2, scale=0.5),
        weights_on(("k_proj", "down_proj"), 8, seed=3, scale=3.0),
    ]
    pool = pool_of(adapters)
    slots = [3, 0, -1, 2, 1, 3, 0]
    batch = pool.prepare(torch.tensor(slots))
    assert batch.strategy is Strategy.BATCHED and batch.grid is not None
    alphas = dict(zip(("q", "k", "v", "o"), batch.grid.alphas[:4], strict=True))
    # q: one non-zero scale (slots without q have zero rows there); k: 2.0 and 3.0 differ
    assert alphas == {"q": 2.0, "k": None, "v": 0.0, "o": 0.0}
    run_all_modules(pool, adapters, slots, seed=11)


@pytest.mark.parametrize(
    ("ranks", "slots", "one_grid"),
    [
        ((8, 8, 8), [0, 2, 1, 0], True),  # the padded input has zero rows in slot 2's block
        ((8, 16, 8), [0, 2, 1, 0, 0], False),  # slot 2's block repeats its own token
    ],
)
def test_one_adapters_overflow_does_not_reach_other_tokens(
    ranks: tuple[int, ...], slots: list[int], one_grid: bool
) -> None:
    adapters = [weights_on(("q_proj",), r, seed=s, scale=1.0) for s, r in enumerate(ranks)]
    huge = adapters[2].modules[0]
    adapters[2] = AdapterWeights(
        adapters[2].digest,
        torch.float32,
        (ModuleWeights(0, "q_proj", huge.lora_a * 3e38, huge.lora_b * 3e38, 1.0),),
    )
    pool = pool_of(adapters)
    batch = pool.prepare(torch.tensor(slots))
    assert (batch.grid is not None, batch.classes is not None) == (one_grid, not one_grid)
    x = torch.randn(len(slots), 48)
    out = pool.apply(0, "q_proj", x, torch.zeros(len(slots), 48), batch)
    want = expected_delta(x, slots, adapters, 0, "q_proj", 48)
    keep = [t for t, slot in enumerate(slots) if slot != 2]
    torch.testing.assert_close(out[keep].double(), want[keep], rtol=1e-5, atol=1e-4)


def test_slots_off_one_grid_run_one_block_group_per_rank_class() -> None:
    pool, adapters = filled_pool("batched", [16, 8, 16, 16, 16, 16, 16, 16])
    slots = [2, 1, 0, 2, -1]
    batch = pool.prepare(torch.tensor(slots))
    # slot 1's 8 rows shift the slots after it off slot 0's 16-row grid: no one grid, so one
    # group per rank class (8-row slot 1; 16-row slots 0 and 2, 24 rows apart)
    assert batch.strategy is Strategy.BATCHED and batch.grid is None and batch.classes is not None
    groups = [(g.row_lo, g.row_stride, g.num_blocks, g.block_rows, g.tokens_per_block, g.offset)
              for g in batch.classes.groups]  # fmt: skip
    assert groups == [(16, 8, 1, 8, 1, 0), (0, 24, 2, 16, 2, 1)]
    # slot 0's block has one token and one padding row, which repeats that token
    assert batch.classes.tokens.tolist() == [1, 2, 2, 0, 3]
    assert batch.classes.scales[0, :, 0].tolist() == [0.75, 0.5, 0.0, 1.0, 1.0]
    assert batch.classes.alphas == (None,) * len(batch.classes.alphas)  # padded: scaled per row
    run_all_modules(pool, adapters, slots, seed=5)
    # slots 2..4 still share one grid: read in place as before
    assert pool.prepare(torch.tensor([2, 3, 4])).grid is not None


def test_a_rank_class_is_cut_where_its_stride_changes() -> None:
    pool, adapters = filled_pool("batched", [16, 8, 16, 16, 8, 16, 16, 8])
    # 16-row slots start at 0, 24, 40, 64, 80: strides 24, 16, 24, 16
    layout = pool.layout
    classes = [
        (lo, stride, rows, run)
        for lo, stride, rows, run in rank_classes(layout, [0, 2, 3, 5, 6, 1, 4])
    ]
    assert classes == [
        (16, 40, 8, [1, 4]),
        (0, 24, 16, [0, 2]),
        (40, 24, 16, [3, 5]),
        (80, 16, 16, [6]),
    ]
    slots = [6, 0, 1, 2, 3, 4, 5, 0, 6, 6]
    batch = pool.prepare(torch.tensor(slots))
    assert batch.classes is not None and len(batch.classes.groups) == 4
    run_all_modules(pool, adapters, slots, seed=6)


def test_strided_block_views_are_views_made_once() -> None:
    pool, _ = filled_pool("batched", [16, 8, 16, 16, 16, 16, 16, 16])
    batch = pool.prepare(torch.tensor([0, 2]))
    assert batch.classes is not None
    (group,) = batch.classes.groups
    view = pool.module_weights(0, "q_proj")
    lora_a_t, lora_b_t = view.strided(group)
    assert lora_a_t.shape == (2, 48, 16) and lora_b_t.shape == (2, 16, 48)
    assert lora_a_t.data_ptr() == view.lora_a.data_ptr()  # no copy: loads show through
    assert torch.equal(lora_a_t[1], view.lora_a[24:40].T)
    assert torch.equal(lora_b_t[1], view.lora_b[24:40])
    assert view.strided(group)[0] is lora_a_t
    # every step's subset of slots may make new groups: the kept views are bounded
    for stride in range(16, 16 + MAX_STRIDED_VIEWS):  # inside the 512-row arena
        for blocks in (1, 2):
            view.strided(BlockGroup(0, stride, blocks, 16, 1, 0))
    assert 0 < len(view._strided) <= MAX_STRIDED_VIEWS


def test_view_caches_carry_over_a_republication_and_stay_bounded() -> None:
    pool, _ = filled_pool("batched", EQUAL_RANKS)
    view = pool.module_weights(0, "q_proj")
    rows = view.slots[1]
    pair = view.pair(rows)
    republished = view.with_slots(view.slots)
    assert republished.pair(rows) is pair  # kept views carry over: no rebuild per load
    assert republished.slots is view.slots and republished.table_index == view.table_index
    # the caches now outlive every re-publication, so each is bounded as the strided one is
    for row_lo in range(MAX_STRIDED_VIEWS + 8):
        republished.blocks(BlockPlan(row_lo, 1, 16, 1, torch.ones(1), ()))
        republished.pair(SlotRows(row_lo, 1, 1.0))
    assert 0 < len(republished._blocks) <= MAX_STRIDED_VIEWS
    assert 0 < len(republished._pairs) <= MAX_STRIDED_VIEWS


def test_block_views_are_views_made_once() -> None:
    pool, _ = filled_pool("batched", EQUAL_RANKS)
    batch = pool.prepare(torch.arange(8))
    assert batch.grid is not None
    view = pool.module_weights(0, "q_proj")
    lora_a_t, lora_b_t = view.blocks(batch.grid)
    assert lora_a_t.shape == (8, 48, 16) and lora_b_t.shape == (8, 16, 48)
    assert lora_a_t.data_ptr() == view.lora_a.data_ptr()  # no copy: loads show through
    assert torch.equal(lora_a_t[3], view.lora_a[48:64].T)
    assert view.blocks(batch.grid)[0] is lora_a_t


def test_bfloat16_batched_close_to_float32() -> None:
    pool32, adapters = filled_pool("batched", EQUAL_RANKS)
    pool16 = LoraSlotPool(SPEC, 8, 64, dtype=torch.bfloat16, device=torch.device("cpu"),
                          backend="batched")  # fmt: skip
    for slot, weights in enumerate(adapters):
        pool16.load(slot, weights)
    slots = torch.tensor([4, 0, 1, -1, 7, 4])
    x = torch.randn(6, 48, generator=torch.Generator().manual_seed(3))
    out32 = pool32.apply(0, "q_proj", x, torch.zeros(6, 48), pool32.prepare(slots))
    out16 = pool16.apply(
        0, "q_proj", x.bfloat16(), torch.zeros(6, 48, dtype=torch.bfloat16), pool16.prepare(slots)
    ).float()
    assert torch.equal(out16[3], torch.zeros(48))
    adapted = [0, 1, 2, 4, 5]
    error = (out16[adapted] - out32[adapted]).norm(dim=1) / out32[adapted].norm(dim=1)
    assert error.max().item() < 0.02, error


@pytest.mark.parametrize(
    ("shape", "width", "strategy"),
    [
        # the large preset (width 1664 on q/k/v/o), 16 tokens on 16 rank-16 adapters
        (StepShape(16, 16, 256, 256, 256, 256, 256), 1664, Strategy.BATCHED),
        # the same adapters, prefill: 16 runs of 64 tokens pad nothing either
        (StepShape(1024, 16, 256, 256, 16384, 256, 16384), 1664, Strategy.BATCHED),
        # one hot adapter (17 tokens) among 15 others: padding every block to 17 costs more
        (StepShape(32, 16, 256, 256, 512, 256, 4352), 1664, Strategy.GROUPED),
        # batched left out (block_rows 0): masked against grouped alone, by width
        (StepShape(16, 16, 480, 480, 480), 2597, Strategy.GROUPED),
        (StepShape(16, 16, 480, 480, 480), 642, Strategy.MASKED),
        # one run is already exact
        (StepShape(4, 1, 16, 16, 64, 16, 64), 642, Strategy.GROUPED),
    ],
)
def test_auto_chooses_the_cheapest(shape: StepShape, width: int, strategy: Strategy) -> None:
    assert AutoPolicy().choose(shape, width) is strategy


def test_on_a_gpu_launches_decide_and_grouped_loses_decode_batches() -> None:
    # the large preset's decode batch of 32 over the 16 S2 adapters (2 tokens each): on a CPU
    # grouped's exact work wins (measured), on an H200 its 31 launches lost 3x to masked's 4
    decode = {"num_tokens": 32, "runs": 16, "covered_rows": 480, "active_rows": 480}
    cpu = StepShape(**decode, exact_cells=960)
    gpu = StepShape(**decode, exact_cells=960, on_accelerator=True)
    assert AutoPolicy().choose(cpu, 1664) is Strategy.GROUPED
    assert AutoPolicy().choose(gpu, 1664) is Strategy.MASKED
    # one long prompt on one small adapter among wide ones: masked's waste outweighs 3 launches
    one = StepShape(8192, 2, 512, 512, 8192 * 8 + 64, on_accelerator=True)
    assert AutoPolicy().choose(one, 1664) is Strategy.GROUPED
    assert AutoPolicy(accelerator_launch_macs=1 << 40).choose(one, 1664) is Strategy.MASKED
    with pytest.raises(ValueError, match="accelerator_launch_macs"):
        AutoPolicy(accelerator_launch_macs=-1)


def test_step_shape_reads_the_device_off_the_pool() -> None:
    def layout(device: str) -> ArenaLayout:
        owner = torch.zeros(32, dtype=torch.int64, device=device)
        return ArenaLayout(owner, torch.zeros(4, 32, device=device), (0, 16), (16, 16), (3,) * 4)

    assert not StepShape.of(4, {0: 2, 1: 2}, layout("cpu")).on_accelerator
    # "meta" stands in for any device that is not the CPU (CUDA is not here)
    assert StepShape.of(4, {0: 2, 1: 2}, layout("meta")).on_accelerator


def test_16_bit_weights_on_a_cpu_make_skinny_matmuls_dearer() -> None:
    r16 = {"num_tokens": 16, "runs": 16, "covered_rows": 256, "active_rows": 256}
    shape = StepShape(**r16, exact_cells=256, block_rows=256, padded_cells=256)
    half = StepShape(**r16, exact_cells=256, block_rows=256, padded_cells=256, half_on_cpu=True)
    assert AutoPolicy().choose(shape, 1664) is Strategy.BATCHED
    assert AutoPolicy().choose(half, 1664) is Strategy.MASKED
    plain = AutoPolicy(half_cpu_read_factor=1, half_cpu_masked_divisor=1)
    assert plain.choose(half, 1664) is Strategy.BATCHED
    with pytest.raises(ValueError, match="half_cpu_read_factor"):
        AutoPolicy(half_cpu_read_factor=-1)


# bench modes' 20-sequence decode step, 80 % on the hot slot (16 tokens, 4 runs), bfloat16 on a
# CPU, and its 16-sequence one (13 hot tokens); StepShape.of on the bench's pool
SKEWED20 = StepShape(
    20, 4, 408, 176, 448, 176, 448, True, False, 3, 20, float32_runs=4, float32_rows=176,
    float32_cells=448, adapter_tokens=20,
)  # fmt: skip
SKEWED16 = StepShape(
    16, 4, 472, 120, 312, 120, 312, True, False, 4, 16, float32_runs=4, float32_rows=120,
    float32_cells=312, adapter_tokens=16,
)  # fmt: skip


@pytest.mark.parametrize("width", [642, 2597])  # the small and large presets' mean widths
def test_16_bit_cpu_steps_weigh_the_dtypes_call_cost_and_masked_amx_rate(width: int) -> None:
    """Measured (docs/modes.md, thirteenth pass): forcing masked beat grouped on the 20-sequence
    80 % batch in bfloat16 on the CPU, where the policy without the half-CPU terms picked
    grouped; on the 16-sequence one the float32 pass (grouped, every run short) was fastest."""
    without = AutoPolicy(half_cpu_call_macs=0, half_cpu_masked_divisor=1)
    assert without.choose(SKEWED20, width) is Strategy.GROUPED
    assert AutoPolicy().choose(SKEWED20, width) is Strategy.MASKED
    assert AutoPolicy().choose(SKEWED16, width) is Strategy.GROUPED
    assert AutoPolicy().grouped_in_float32(SKEWED16, width)
    # without short runs there is no float32 pass to weigh
    dtype_only = StepShape(**{**SKEWED16.__dict__, "float32_runs": 0, "float32_rows": 0})
    assert not AutoPolicy().grouped_in_float32(dtype_only, width)
    # float32 weights: none of the half-CPU terms apply
    full = StepShape(**{**SKEWED20.__dict__, "half_on_cpu": False})
    assert AutoPolicy().choose(full, width) is without.choose(full, width)


@pytest.mark.parametrize(
    "field", ["half_cpu_call_macs", "float32_convert_macs", "float32_pass_launches"]
)
def test_the_half_cpu_terms_are_validated(field: str) -> None:
    with pytest.raises(ValueError, match=f"{field} -1 is invalid"):
        AutoPolicy(**{field: -1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="half_cpu_masked_divisor 0 is invalid"):
        AutoPolicy(half_cpu_masked_divisor=0)


def test_step_shape_counts_the_float32_passes_short_runs() -> None:
    pool16 = LoraSlotPool(SPEC, 8, 64, dtype=torch.bfloat16, device=torch.device("cpu"))
    pool32, adapters = filled_pool("auto", [64, 32, 16, 8] * 2)
    for slot, weights in enumerate(adapters):
        pool16.load(slot, weights)
    tokens = {0: 17, 1: 1, 2: 2}  # slot 0's run is above a cap of 16
    shape = StepShape.of(20, tokens, pool16.layout, 16)
    rows = pool16.layout.slot_rows
    assert (shape.float32_runs, shape.float32_rows) == (2, rows[1] + rows[2])
    assert (shape.float32_cells, shape.adapter_tokens) == (rows[1] + 2 * rows[2], 20)
    for none in (
        StepShape.of(20, tokens, pool16.layout),  # no cap: no float32 pass
        StepShape.of(20, tokens, pool32.layout, 16),  # float32 weights
        StepShape.of(17, {0: 17}, pool16.layout, 16),  # one run
        StepShape.of(20, {0: 17, 1: 3}, pool16.layout, 2),  # no run short enough
    ):
        assert (none.float32_runs, none.float32_rows, none.adapter_tokens) == (0, 0, 0)


def test_the_pool_dtype_sets_half_on_cpu() -> None:
    pool32, adapters = filled_pool("auto", EQUAL_RANKS)
    pool16 = LoraSlotPool(SPEC, 8, 64, dtype=torch.bfloat16, device=torch.device("cpu"))
    for slot, weights in enumerate(adapters):
        pool16.load(slot, weights)
    tokens = {slot: 1 for slot in range(8)}
    assert not StepShape.of(8, tokens, pool32.layout).half_on_cpu
    assert StepShape.of(8, tokens, pool16.layout).half_on_cpu


def test_auto_runs_batched_on_equal_ranks() -> None:
    pool, adapters = filled_pool("auto", EQUAL_RANKS)
    slots = [*range(8), -1]
    assert pool.prepare(torch.tensor(slots)).strategy is Strategy.BATCHED
    run_all_modules(pool, adapters, slots, seed=9)


def test_step_shape_counts_block_groups_off_one_grid() -> None:
    pool, _ = filled_pool("auto", [64, 32, 16, 8] * 2)
    tokens = {slot: 2 for slot in range(8)}
    shape = StepShape.of(16, tokens, pool.layout)
    # S2 packed round-robin: each rank class lies at one stride (120 rows)
    assert shape.block_groups == 4
    assert shape.block_rows == 2 * 120 and shape.padded_cells == 2 * 2 * 120
    assert shape.gathered == 16
    equal = StepShape.of(
        8, {slot: 1 for slot in range(8)}, filled_pool("auto", EQUAL_RANKS)[0].layout
    )
    assert equal.block_groups == 0 and equal.block_rows == 8 * 16


def test_auto_batches_mixed_ranks_per_class_where_it_is_cheapest() -> None:
    # the small preset's 32-token decode step over 16 S2 adapters (width 416), measured: per
    # rank class batched beat masked and grouped (docs/benchmarks/execution.md)
    s2 = {"num_tokens": 32, "runs": 16, "covered_rows": 480, "active_rows": 480}
    blocked = {"block_rows": 480, "padded_cells": 960, "block_groups": 4, "gathered": 32}
    shape = StepShape(**s2, exact_cells=960, **blocked)
    assert AutoPolicy().choose(shape, 416) is Strategy.BATCHED
    # prefill, 16 x 64 tokens: copying every token in and out costs more than grouped's
    # launches over long runs it reads in place
    prefill = {**s2, "num_tokens": 1024, "exact_cells": 30720, "padded_cells": 30720}
    prefill_shape = StepShape(**prefill, block_rows=480, block_groups=4, gathered=1024)
    assert AutoPolicy().choose(prefill_shape, 416) is Strategy.GROUPED
    # each group's launches count: on a GPU they decide, and 16-bit CPU reads stay dear
    gpu = StepShape(**s2, exact_cells=960, **blocked, on_accelerator=True)
    assert AutoPolicy().choose(gpu, 416) is Strategy.MASKED
    half = StepShape(**s2, exact_cells=960, **blocked, half_on_cpu=True)
    assert AutoPolicy().choose(half, 416) is Strategy.MASKED
    # sixteen groups of one slot cost more launches than they save
    many = StepShape(**s2, exact_cells=960, **{**blocked, "block_groups": 16})
    assert AutoPolicy().choose(many, 416) is not Strategy.BATCHED


def test_auto_runs_batched_per_rank_class_on_s2() -> None:
    pool, adapters = filled_pool("auto", [64, 32, 16, 8] * 2)
    # the tiny spec is launch-bound; with free launches and copies batching ties grouped's
    # exact work and wins the tie
    pool.backend = AutoBackend(AutoPolicy(launch_macs=0, read_macs=0))
    slots = [*range(8), *range(8), -1]
    batch = pool.prepare(torch.tensor(slots))
    assert batch.strategy is Strategy.BATCHED and batch.classes is not None
    run_all_modules(pool, adapters, slots, seed=12)


def test_one_scale_per_module_across_rank_classes_is_one_alpha() -> None:
    adapters = [weights_on(("q_proj", "k_proj"), rank, seed=s, scale=2.0) for s, rank in
                enumerate((8, 16, 8, 16))]  # fmt: skip
    pool = pool_of(adapters)
    slots = [3, 0, 1, 2, -1]
    batch = pool.prepare(torch.tensor(slots))
    assert batch.classes is not None and len(batch.classes.groups) == 2
    assert batch.classes.alphas[:2] == (2.0, 2.0)  # q and k of layer 0: no per-row scaling
    for module in ("q_proj", "k_proj"):
        x = torch.randn(5, 48)
        d_out = pool.module_weights(0, module).lora_b.shape[1]
        out = pool.apply(0, module, x, torch.zeros(5, d_out), batch)
        want = expected_delta(x, slots, adapters, 0, module, d_out)
        torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-4)


def _preset_pool(name: str, dtype: torch.dtype) -> LoraSlotPool:
    """An ``auto`` pool of a demo preset's shapes holding 16 adapters of the S2 mix (ranks 64,
    32, 16, 8 round-robin) on every target module (zero weights: only the shapes matter)."""
    preset = get_preset(name)
    spec = BaseModelSpec(name, "LlamaForCausalLM", preset.hidden_size,
                         preset.intermediate_size, preset.num_layers, preset.num_heads,
                         preset.num_kv_heads, preset.hidden_size // preset.num_heads, 4096,
                         "0" * 64)  # fmt: skip
    pool = LoraSlotPool(spec, 16, 64, dtype=dtype, device=torch.device("cpu"), backend="auto")
    for slot in range(16):
        rank = S2_RANKS[slot % len(S2_RANKS)]
        pairs = []
        for layer in range(spec.num_layers):
            for module in TARGET_MODULES:
                d_in, d_out = spec.module_shape(module)
                a, b = torch.zeros(rank, d_in), torch.zeros(d_out, rank)
                pairs.append(ModuleWeights(layer, module, a, b, 1.0))
        pool.load(slot, AdapterWeights(f"{slot + 200:064x}", torch.float32, tuple(pairs)))
    return pool


def test_auto_runs_the_small_presets_16_adapter_decode_batch_as_the_policy_comment_says() -> None:
    """``AutoPolicy``'s comment said its constants put the small preset's 16-adapter decode
    batch on masked, which held before batched was weighed: in float32 on a CPU it runs batched
    per rank class; in bfloat16 on a CPU with native bfloat16 arithmetic, masked (without it,
    grouped through the float32 pass: test_bfloat16_emulated.py); a prefill of four 64-token
    runs, grouped. (The large preset's pool takes 85 s to fill here; it chose alike in a
    one-off probe.)"""
    decode = torch.tensor(list(range(16)))
    pool = _preset_pool("small", torch.float32)
    batch = pool.prepare(decode)
    assert batch.strategy is Strategy.BATCHED and batch.classes is not None
    prefill = torch.tensor([slot for slot in range(4) for _ in range(64)])
    assert pool.prepare(prefill).strategy is Strategy.GROUPED
    half = _preset_pool("small", torch.bfloat16)
    half.backend = AutoBackend(bfloat16_emulated=False)  # any CPU: the native costs
    assert half.prepare(decode).strategy is Strategy.MASKED
    half.backend = AutoBackend(bfloat16_emulated=True)
    emulated = half.prepare(decode)
    assert emulated.strategy is Strategy.GROUPED and emulated.float32
