"""Every backend equals the per-token definition of the op over popularity patterns, rank mixes."""

from __future__ import annotations

import random

import pytest
import torch

from loraplex.artifacts.base_model import TARGET_MODULES, BaseModelSpec
from loraplex.model.adapter_weights import AdapterWeights, ModuleWeights
from loraplex.model.lora import LoraSlotPool
from loraplex.ops import AutoPolicy, Strategy, backend_names, get_backend, register_backend
from loraplex.ops.policy import StepShape
from loraplex.ops.reference import ReferenceBackend

SPEC = BaseModelSpec("tiny", "LlamaForCausalLM", 48, 80, 2, 4, 2, 12, 64, "0" * 64)
MODULES = ("q_proj", "k_proj", "o_proj", "down_proj")
NUM_SLOTS = 8
RANK_MIXES = {
    "all8": [8] * NUM_SLOTS,
    "S2": [64, 32, 16, 8] * 2,
    "all64": [64] * NUM_SLOTS,
    "hetero": [3, 64, 1, 17, 40, 5, 64, 2],
}
PATTERNS = ("identical", "distinct", "uniform", "zipf", "geometric")
BACKENDS = ("reference", "masked", "grouped", "batched", "auto")


def make_weights(rank: int, seed: int, *, modules: tuple[str, ...] = MODULES) -> AdapterWeights:
    """Random non-zero pairs; the second layer uses half the rank (a rank_pattern stand-in)."""
    gen = torch.Generator().manual_seed(seed)
    pairs = []
    for layer in range(SPEC.num_layers):
        layer_rank = rank if layer == 0 else max(1, rank // 2)
        for module in modules:
            d_in, d_out = SPEC.module_shape(module)
            lora_a = torch.randn(layer_rank, d_in, generator=gen)
            lora_b = torch.randn(d_out, layer_rank, generator=gen)
            pairs.append(ModuleWeights(layer, module, lora_a, lora_b, 0.5 + seed * 0.25))
    return AdapterWeights(f"{seed:064x}", torch.float32, tuple(pairs))


def sample_slots(pattern: str, num_seqs: int, rng: random.Random) -> list[int]:
    if pattern == "identical":
        return [3] * num_seqs
    if pattern == "distinct":
        return [i % NUM_SLOTS for i in range(num_seqs)]
    if pattern == "uniform":
        return [rng.randrange(NUM_SLOTS) for _ in range(num_seqs)]
    if pattern == "zipf":
        weights = [1.0 / (i + 1) for i in range(NUM_SLOTS)]
    else:
        weights = [1.5**-i for i in range(NUM_SLOTS)]
    return rng.choices(range(NUM_SLOTS), weights=weights, k=num_seqs)


def expected_delta(
    x: torch.Tensor,
    slots: list[int],
    adapters: list[AdapterWeights],
    layer: int,
    module: str,
    d_out: int,
) -> torch.Tensor:
    """The op's definition, token by token, in float64."""
    out = torch.zeros(len(slots), d_out, dtype=torch.float64)
    for t, slot in enumerate(slots):
        if slot < 0:
            continue
        for pair in adapters[slot].modules:
            if (pair.layer, pair.module) == (layer, module):
                hidden = x[t].double() @ pair.lora_a.double().T
                out[t] = pair.scale * hidden @ pair.lora_b.double().T
    return out


def filled_pool(backend: str, ranks: list[int]) -> tuple[LoraSlotPool, list[AdapterWeights]]:
    pool = LoraSlotPool(
        SPEC, NUM_SLOTS, 64, dtype=torch.float32, device=torch.device("cpu"), backend=backend
    )
    adapters = [make_weights(rank, seed) for seed, rank in enumerate(ranks)]
    for slot, weights in enumerate(adapters):
        pool.load(slot, weights)
    return pool, adapters


def run_all_modules(
    pool: LoraSlotPool, adapters: list[AdapterWeights], slots: list[int], seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    token_slots = torch.tensor(slots, dtype=torch.int64)
    batch = pool.prepare(token_slots)
    for layer in range(SPEC.num_layers):
        for module in (*MODULES, "v_proj"):
            d_in, d_out = SPEC.module_shape(module)
            x = torch.randn(len(slots), d_in, generator=gen)
            base = torch.randn(len(slots), d_out, generator=gen)
            out = pool.apply(layer, module, x, base.clone(), batch)
            want = base.double() + expected_delta(x, slots, adapters, layer, module, d_out)
            torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("mix", sorted(RANK_MIXES))
def test_decode_matches_definition(backend: str, pattern: str, mix: str) -> None:
    pool, adapters = filled_pool(backend, RANK_MIXES[mix])
    rng = random.Random(f"{pattern}-{mix}")
    slots = sample_slots(pattern, 12, rng)
    slots[rng.randrange(len(slots))] = -1  # a base-only sequence rides along
    run_all_modules(pool, adapters, slots, seed=1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("tokens_per_seq", [64, 512])
def test_prefill_matches_definition(backend: str, pattern: str, tokens_per_seq: int) -> None:
    pool, adapters = filled_pool(backend, RANK_MIXES["S2"])
    rng = random.Random(pattern)
    num_seqs = 6 if tokens_per_seq == 64 else 2
    seq_slots = [*sample_slots(pattern, num_seqs, rng), -1]
    slots = [slot for slot in seq_slots for _ in range(tokens_per_seq)]
    run_all_modules(pool, adapters, slots, seed=2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mixed_prefill_and_decode_step(backend: str) -> None:
    """Continuous batching: prefill chunks and decode tokens of many adapters in one step."""
    pool, adapters = filled_pool(backend, RANK_MIXES["hetero"])
    slots = [2] * 20 + [0, 5, -1, 7, 2] + [6] * 9 + [1, 1, 3]
    run_all_modules(pool, adapters, slots, seed=3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_base_only_and_empty_slots_add_nothing(backend: str) -> None:
    pool, _ = filled_pool(backend, RANK_MIXES["all8"])
    pool.clear(4)
    batch = pool.prepare(torch.tensor([-1, 4, -1, 4]))
    assert batch.strategy is Strategy.NONE
    x, base = torch.randn(4, 48), torch.randn(4, 48)
    assert torch.equal(pool.apply(0, "q_proj", x, base.clone(), batch), base)


@pytest.mark.parametrize("backend", BACKENDS)
def test_untargeted_module_is_exactly_base(backend: str) -> None:
    pool, _ = filled_pool(backend, RANK_MIXES["S2"])
    batch = pool.prepare(torch.arange(NUM_SLOTS))
    x, base = torch.randn(NUM_SLOTS, 48), torch.randn(NUM_SLOTS, 24)
    assert torch.equal(pool.apply(1, "v_proj", x, base.clone(), batch), base)


def test_auto_picks_masked_for_decode_and_grouped_for_prefill() -> None:
    pool, _ = filled_pool("auto", RANK_MIXES["S2"])
    decode = pool.prepare(torch.arange(NUM_SLOTS))
    prefill = pool.prepare(torch.arange(NUM_SLOTS).repeat_interleave(64))
    single = pool.prepare(torch.full((4,), 2))
    assert (decode.strategy, prefill.strategy) == (Strategy.MASKED, Strategy.GROUPED)
    assert single.strategy is Strategy.GROUPED
    assert prefill.order is None and len(prefill.segments) == NUM_SLOTS


def test_pool_layout_width_is_the_mean_module_width() -> None:
    pool, _ = filled_pool("auto", RANK_MIXES["S2"])
    widths = [sum(SPEC.module_shape(m)) for m in TARGET_MODULES]
    assert pool.layout.width == round(sum(widths) / len(widths))


@pytest.mark.parametrize(
    ("shape", "width", "masked"),
    [
        # the small preset (width 642): 16 tokens on 16 adapters (480 rows, all active) -> masked
        (StepShape(16, 16, 480, 480, 480), 642, True),
        # the same preset, 20 tokens: 16 on one rank-16 adapter, 4 on 4 others -> grouped
        (StepShape(20, 5, 480, 150, 376), 642, False),
        # merged, the 4 foreign tokens gathered: few active rows inside a wide covered range
        (StepShape(4, 4, 270, 120, 120), 642, False),
        # the large preset (width 2597), 16 tokens on 16 adapters -> grouped
        (StepShape(16, 16, 480, 480, 480), 2597, False),
        # one run is already exact
        (StepShape(4, 1, 8, 8, 32), 642, False),
    ],
)
def test_auto_weighs_wasted_work_and_reads_by_width_against_saved_launches(
    shape: StepShape, width: int, masked: bool
) -> None:
    assert AutoPolicy().masked(shape, width) is masked


def test_grouped_sorts_scattered_tokens_stably() -> None:
    pool, _ = filled_pool("grouped", RANK_MIXES["all8"])
    batch = pool.prepare(torch.tensor([1, 0, -1, 1, 0]))
    assert batch.order is not None
    assert batch.order.tolist() == [1, 4, 0, 3]
    assert [(s.start, s.end, s.slot) for s in batch.segments] == [(0, 2, 0), (2, 4, 1)]


def test_masked_covers_only_active_rows() -> None:
    pool, _ = filled_pool("masked", RANK_MIXES["S2"])
    batch = pool.prepare(torch.tensor([2, 3]))
    layout = pool.layout
    assert batch.row_lo == layout.slot_starts[2]
    assert batch.row_hi == layout.slot_starts[3] + layout.slot_rows[3]
    assert batch.row_hi - batch.row_lo == 16 + 8  # rank-exact: no padding to 64


@pytest.mark.parametrize(
    "bad", [torch.tensor([0, 8]), torch.tensor([-2]), torch.tensor([[0]]), torch.tensor([0.0])]
)
def test_prepare_rejects_bad_token_slots(bad: torch.Tensor) -> None:
    pool, _ = filled_pool("auto", RANK_MIXES["all8"])
    with pytest.raises(ValueError, match="token_slots"):
        pool.backend.prepare(bad, pool.layout)


def test_registry_rejects_duplicates_and_unknown_names() -> None:
    assert {"reference", "masked", "grouped", "auto"} <= set(backend_names())
    with pytest.raises(ValueError, match="already registered"):
        register_backend("reference", ReferenceBackend)
    with pytest.raises(ValueError, match="unknown"):
        get_backend("no-such-backend")


@pytest.mark.parametrize("backend", ["masked", "grouped", "auto"])
def test_bfloat16_close_to_float32(backend: str) -> None:
    pool32, adapters = filled_pool(backend, RANK_MIXES["S2"])
    pool16 = LoraSlotPool(
        SPEC, NUM_SLOTS, 64, dtype=torch.bfloat16, device=torch.device("cpu"), backend=backend
    )
    for slot, weights in enumerate(adapters):
        pool16.load(slot, weights)
    slots = torch.tensor([0, 1, 2, 3, 4, 5, -1, 7])
    x = torch.randn(8, 48, generator=torch.Generator().manual_seed(3))
    out32 = pool32.apply(0, "q_proj", x, torch.zeros(8, 48), pool32.prepare(slots))
    out16 = pool16.apply(
        0, "q_proj", x.bfloat16(), torch.zeros(8, 48, dtype=torch.bfloat16), pool16.prepare(slots)
    ).float()
    # Per token, relative to the token's output norm: single elements near zero can carry a
    # large relative error after a few bfloat16 roundings without the op being wrong.
    assert torch.equal(out16[6], torch.zeros(48))  # the token without an adapter
    adapted = [0, 1, 2, 3, 4, 5, 7]
    error = (out16[adapted] - out32[adapted]).norm(dim=1) / out32[adapted].norm(dim=1)
    assert error.max().item() < 0.02, error


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_cuda_matches_cpu(backend: str) -> None:
    pool_cpu, adapters = filled_pool(backend, RANK_MIXES["S2"])
    pool_gpu = LoraSlotPool(
        SPEC, NUM_SLOTS, 64, dtype=torch.float32, device=torch.device("cuda"), backend=backend
    )
    for slot, weights in enumerate(adapters):
        pool_gpu.load(slot, weights)
    for slots in ([0, 1, 2, -1, 4, 5, 6, 7], [3] * 64 + [5] * 64):
        token_slots = torch.tensor(slots)
        x = torch.randn(len(slots), 48)
        want = pool_cpu.apply(
            0, "q_proj", x, torch.zeros(len(slots), 48), pool_cpu.prepare(token_slots)
        )
        got = pool_gpu.apply(
            0,
            "q_proj",
            x.cuda(),
            torch.zeros(len(slots), 48, device="cuda"),
            pool_gpu.prepare(token_slots.cuda()),
        )
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-3)


def test_a_slots_views_are_made_once_per_arena_view_and_match_its_rows() -> None:
    pool, _ = filled_pool("grouped", RANK_MIXES["S2"])
    view = pool.module_weights(0, "q_proj")
    rows = next(r for r in view.slots if r.rank)
    lora_a_t, lora_b_t = view.pair(rows)
    span = slice(rows.start, rows.start + rows.rank)
    assert torch.equal(lora_a_t, view.lora_a[span].T) and torch.equal(lora_b_t, view.lora_b[span])
    assert view.pair(rows)[0] is lora_a_t  # kept, not sliced again each step
    assert lora_a_t.data_ptr() == view.lora_a[span].data_ptr()  # a view: loads show through
