"""The slot pool: PEFT-equal outputs and scales, load/clear/reload; failed loads change nothing."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from loraplex.artifacts.base_model import TARGET_MODULES, BaseModelSpec
from loraplex.artifacts.validate import validate_adapter_dir
from loraplex.errors import BaseModelMismatchError, RankTooLargeError, TensorValidationError
from loraplex.model.adapter_weights import (
    AdapterWeights,
    ModuleRun,
    ModuleWeights,
    load_adapter_weights,
)
from loraplex.model.lora import LoraSlotPool, OpTimer
from loraplex.model.lora_arena import ArenaStore
from loraplex.ops import SlotRows, get_backend

CPU = torch.device("cpu")
PEFT_CONFIGS: dict[str, dict[str, Any]] = {
    "plain": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]},
    "patterns": {
        "r": 4,
        "lora_alpha": 8,
        "target_modules": list(TARGET_MODULES),
        "rank_pattern": {"v_proj": 12, "layers.1.mlp.down_proj": 2},
        "alpha_pattern": {"o_proj": 3, "gate_proj": 40},
    },
    "rslora": {
        "r": 16,
        "lora_alpha": 8,
        "use_rslora": True,
        "target_modules": ["k_proj", "o_proj", "up_proj"],
        "layers_to_transform": [1],
    },
}


def make_peft_adapter(model_dir: Path, out: Path, config: dict[str, Any], seed: int) -> Any:
    """A PEFT model with random non-zero A and B, saved with save_pretrained to ``out``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    lora_config = LoraConfig(init_lora_weights=False, lora_dropout=0.0, **config)
    peft_model = get_peft_model(model, lora_config).eval()
    peft_model.peft_config["default"].base_model_name_or_path = str(model_dir)
    peft_model.save_pretrained(out)
    return peft_model


def lora_layers(peft_model: Any) -> dict[tuple[int, str], Any]:
    found = {}
    for layer, block in enumerate(peft_model.base_model.model.model.layers):
        for module in TARGET_MODULES:
            parent = block.self_attn if module in TARGET_MODULES[:4] else block.mlp
            found[(layer, module)] = getattr(parent, module)
    return found


@pytest.fixture
def peft_setup(tiny_model: Callable[..., Path], tmp_path: Path) -> Callable[..., Any]:
    model_dir = tiny_model()
    spec = BaseModelSpec.from_dir(model_dir)

    def make(config: dict[str, Any], seed: int = 0) -> tuple[Any, AdapterWeights, BaseModelSpec]:
        out = tmp_path / f"adapter{seed}-{len(list(tmp_path.iterdir()))}"
        peft_model = make_peft_adapter(model_dir, out, config, seed)
        validated = validate_adapter_dir(out, spec, max_lora_rank=16)
        return peft_model, load_adapter_weights(validated, dtype=torch.float32), spec

    return make


@pytest.mark.parametrize("name", sorted(PEFT_CONFIGS))
@pytest.mark.parametrize("backend", ["reference", "batched", "auto"])
def test_every_module_equals_peft(peft_setup: Callable[..., Any], name: str, backend: str) -> None:
    peft_model, weights, spec = peft_setup(PEFT_CONFIGS[name])
    pool = LoraSlotPool(spec, 3, 16, dtype=torch.float32, device=CPU, backend=backend)
    pool.load(1, weights)
    token_slots = torch.tensor([1, -1, 1, 0, 1])
    batch = pool.prepare(token_slots)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for (layer, module), peft_layer in lora_layers(peft_model).items():
            d_in, _ = spec.module_shape(module)
            x = torch.randn(5, d_in, generator=gen)
            base_layer = getattr(peft_layer, "base_layer", peft_layer)
            out = pool.apply(layer, module, x, base_layer(x), batch)
            targeted = hasattr(peft_layer, "scaling") and "default" in peft_layer.scaling
            want_lora = peft_layer(x) if targeted else base_layer(x)
            torch.testing.assert_close(out[[0, 2, 4]], want_lora[[0, 2, 4]], rtol=1e-5, atol=1e-5)
            assert torch.equal(out[[1, 3]], base_layer(x)[[1, 3]])
            rows = pool.module_weights(layer, module).slots[1]
            if targeted:
                assert rows.scale == peft_layer.scaling["default"]
                assert rows.rank == peft_layer.r["default"]
            else:
                assert (rows.rank, rows.scale) == (0, 0.0)
    pool.check_integrity()


SPEC = BaseModelSpec("tiny", "LlamaForCausalLM", 32, 48, 2, 4, 2, 8, 64, "0" * 64)


def weights_of(
    rank: int,
    seed: int,
    modules: tuple[str, ...] = ("q_proj", "down_proj"),
    layers: tuple[int, ...] = (0, 1),
) -> AdapterWeights:
    gen = torch.Generator().manual_seed(seed)
    pairs = []
    for layer in layers:
        for module in modules:
            d_in, d_out = SPEC.module_shape(module)
            pairs.append(
                ModuleWeights(
                    layer,
                    module,
                    torch.randn(rank, d_in, generator=gen),
                    torch.randn(d_out, rank, generator=gen),
                    1.0 + seed,
                )
            )
    return AdapterWeights(f"{seed:064x}", torch.float32, tuple(pairs))


def delta(pool: LoraSlotPool, slot: int, seed: int = 0) -> torch.Tensor:
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(seed))
    batch = pool.prepare(torch.full((3,), slot))
    return pool.apply(0, "q_proj", x, torch.zeros(3, 32), batch)


def snapshot(pool: LoraSlotPool) -> list[torch.Tensor]:
    views = [pool.module_weights(layer, m) for layer in range(2) for m in TARGET_MODULES]
    return [t.clone() for v in views for t in (v.lora_a, v.lora_b)] + [
        pool.layout.row_owner.clone(),
        pool.layout.row_scale.clone(),
    ]


def test_load_clear_reload() -> None:
    pool = LoraSlotPool(SPEC, 4, 16, dtype=torch.float32, device=CPU)
    first, second = weights_of(8, 1), weights_of(4, 2)
    pool.load(2, first)
    with_first = delta(pool, 2)
    assert with_first.abs().sum() > 0
    info = pool.slot_info(2)
    assert info is not None and info.digest == first.digest and info.num_rows == 8
    assert info.num_bytes == first.num_bytes
    assert pool.occupied_slots() == (2,) and pool.free_slots() == (0, 1, 3)
    pool.clear(2)
    assert pool.slot_info(2) is None and torch.equal(delta(pool, 2), torch.zeros(3, 32))
    pool.check_integrity()
    pool.load(2, second)
    pool.load(2, first)  # replacing an occupant needs no clear first
    assert torch.equal(delta(pool, 2), with_first)
    pool.check_integrity()


def test_load_copies_into_preallocated_buffers() -> None:
    pool = LoraSlotPool(SPEC, 2, 8, dtype=torch.float32, device=CPU)

    def pointers() -> list[int]:
        views = [pool.module_weights(layer, m) for layer in range(2) for m in TARGET_MODULES]
        return [t.data_ptr() for v in views for t in (v.lora_a, v.lora_b)]

    before = pointers()
    weights = weights_of(8, 3)
    pool.load(0, weights)
    pool.clear(0)
    pool.load(1, weights)
    assert pointers() == before
    weights.modules[0].lora_a.zero_()  # the pool holds a copy, not a reference
    assert delta(pool, 1).abs().sum() > 0


def test_fragmented_rows_are_compacted() -> None:
    pool = LoraSlotPool(SPEC, 4, 16, dtype=torch.float32, device=CPU)
    adapters = {slot: weights_of(rank, slot) for slot, rank in enumerate((16, 4, 16, 16))}
    for slot, weights in adapters.items():
        pool.load(slot, weights)
    expected = {slot: delta(pool, slot) for slot in (0, 2, 3)}
    pool.clear(1)  # leaves a 4-row hole; a rank-16 load needs compaction
    pool.load(1, weights_of(16, 9))
    pool.check_integrity()
    for slot, want in expected.items():
        torch.testing.assert_close(delta(pool, slot), want)
    assert sorted(pool.layout.slot_starts) == [0, 16, 32, 48]


def test_mixed_slots_sum_their_own_adapters() -> None:
    pool = LoraSlotPool(SPEC, 4, 16, dtype=torch.float32, device=CPU)
    for slot in range(4):
        pool.load(slot, weights_of(2 + 4 * slot, slot))
    x = torch.randn(4, 32)
    together = pool.apply(0, "q_proj", x, torch.zeros(4, 32), pool.prepare(torch.arange(4)))
    for slot in range(4):
        alone = pool.apply(
            0, "q_proj", x[slot : slot + 1], torch.zeros(1, 32), pool.prepare(torch.tensor([slot]))
        )
        torch.testing.assert_close(together[slot : slot + 1], alone, rtol=1e-5, atol=1e-5)


def test_an_op_timer_counts_the_pools_lora_work_only_while_set() -> None:
    pool = LoraSlotPool(SPEC, 2, 8, dtype=torch.float32, device=CPU)
    pool.load(0, weights_of(8, 0))
    want = delta(pool, 0)
    timer = pool.op_timer = OpTimer(pool.device)
    torch.testing.assert_close(delta(pool, 0), want)  # timing changes no result
    timed = timer.seconds
    assert timed > 0
    pool.op_timer = None
    delta(pool, 0)
    assert timer.seconds == timed


def bad_weights() -> dict[str, tuple[AdapterWeights, type[Exception]]]:
    good = weights_of(8, 4)
    wrong_shape = ModuleWeights(0, "q_proj", torch.randn(8, 31), torch.randn(32, 8), 1.0)
    mismatched_rank = ModuleWeights(0, "q_proj", torch.randn(8, 32), torch.randn(32, 4), 1.0)
    return {
        "rank": (weights_of(32, 5), RankTooLargeError),
        "layer": (weights_of(4, 6, layers=(0, 2)), BaseModelMismatchError),
        "shape": (
            AdapterWeights("f" * 64, torch.float32, (*good.modules, wrong_shape)),
            TensorValidationError,
        ),
        "ranks": (
            AdapterWeights("e" * 64, torch.float32, (mismatched_rank,)),
            TensorValidationError,
        ),
        "twice": (
            AdapterWeights("d" * 64, torch.float32, (*good.modules, good.modules[0])),
            TensorValidationError,
        ),
    }


@pytest.mark.parametrize("case", sorted(bad_weights()))
def test_bad_load_changes_nothing(case: str) -> None:
    pool = LoraSlotPool(SPEC, 3, 16, dtype=torch.float32, device=CPU)
    pool.load(0, weights_of(8, 1))
    pool.load(1, weights_of(16, 2))
    before, layout, info = snapshot(pool), pool.layout, pool.slot_info(1)
    weights, error = bad_weights()[case]
    with pytest.raises(error):
        pool.load(1, weights)
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(pool), strict=True))
    assert pool.layout == layout and pool.slot_info(1) == info
    pool.check_integrity()


def test_pool_restricted_to_attention_rejects_mlp_adapter() -> None:
    pool = LoraSlotPool(
        SPEC,
        2,
        16,
        dtype=torch.float32,
        device=CPU,
        target_modules=("q_proj", "k_proj", "v_proj", "o_proj"),
    )
    with pytest.raises(BaseModelMismatchError, match="not served"):
        pool.load(0, weights_of(4, 1))
    x, base = torch.randn(2, 32), torch.randn(2, 32)
    batch = pool.prepare(torch.zeros(2, dtype=torch.int64))
    assert torch.equal(pool.apply(0, "down_proj", x, base.clone(), batch), base)


def test_sizes_and_argument_checks() -> None:
    pool = LoraSlotPool(SPEC, 4, 16, dtype=torch.bfloat16, device=CPU)
    widths = sum(sum(SPEC.module_shape(m)) for m in TARGET_MODULES) * SPEC.num_layers
    assert pool.bytes_per_slot == 16 * widths * 2
    assert pool.total_bytes == 4 * pool.bytes_per_slot and pool.num_slots == 4
    with pytest.raises(ValueError, match="slot 4"):
        pool.load(4, weights_of(4, 1))
    with pytest.raises(ValueError, match="slot -1"):
        pool.clear(-1)
    with pytest.raises(ValueError, match="max_loras"):
        LoraSlotPool(SPEC, 0, 16, dtype=torch.float32, device=CPU)
    with pytest.raises(ValueError, match="max_lora_rank"):
        LoraSlotPool(SPEC, 1, 0, dtype=torch.float32, device=CPU)
    with pytest.raises(ValueError, match="target_modules"):
        LoraSlotPool(SPEC, 1, 8, dtype=torch.float32, device=CPU, target_modules=("lm_head",))
    with pytest.raises(ValueError, match="unknown"):
        LoraSlotPool(SPEC, 1, 8, dtype=torch.float32, device=CPU, backend="nope")


def packed(weights: AdapterWeights) -> AdapterWeights:
    """The same adapter with its per-module runs packed (as load_adapter_weights builds them)."""
    runs, modules = [], []
    for module in sorted({m.module for m in weights.modules}):
        members = [m for m in weights.modules if m.module == module]
        d_in = members[0].lora_a.shape[1]
        rows = torch.stack([torch.cat([m.lora_a, m.lora_b.T], dim=1) for m in members])
        run = ModuleRun(module, members[0].layer, d_in, rows)
        runs.append(run)
        modules += [
            ModuleWeights(m.layer, module, run.lora_a[i], run.lora_b_t[i].T, m.scale)
            for i, m in enumerate(members)
        ]
    modules.sort(key=lambda m: (m.layer, TARGET_MODULES.index(m.module)))
    return AdapterWeights(weights.digest, weights.dtype, tuple(modules), tuple(runs))


def test_packed_runs_load_like_modules() -> None:
    unpacked, other = weights_of(8, 5), weights_of(4, 6, modules=("q_proj",))
    by_module = LoraSlotPool(SPEC, 3, 8, dtype=torch.float32, device=CPU)
    by_run = LoraSlotPool(SPEC, 3, 8, dtype=torch.float32, device=CPU)
    for pool, weights in ((by_module, unpacked), (by_run, packed(unpacked))):
        pool.load(0, weights)
        pool.load(1, other)
        pool.load(0, other)  # replacing zeroes the old occupant's rows in every stack
        pool.load(0, weights)
        pool.clear(1)
        pool.check_integrity()
    assert all(
        torch.equal(a, b) for a, b in zip(snapshot(by_module), snapshot(by_run), strict=True)
    )
    assert torch.equal(delta(by_run, 0), delta(by_module, 0))


def test_runs_that_disagree_with_modules_are_not_trusted() -> None:
    weights = packed(weights_of(8, 7))
    stale = AdapterWeights(weights.digest, weights.dtype, weights.modules[:-1], weights.runs)
    pool = LoraSlotPool(SPEC, 2, 8, dtype=torch.float32, device=CPU)
    pool.load(0, stale)  # runs cover one module more than ``modules``: copied module by module
    last = weights.modules[-1]
    assert pool.module_weights(last.layer, last.module).slots[0].rank == 0
    assert not pool.module_weights(last.layer, last.module).lora_a.any()
    pool.check_integrity()


@pytest.mark.parametrize("pack", [False, True])
def test_a_copy_reloaded_at_other_rows_equals_a_fresh_load(pack: bool) -> None:
    """The checks and destinations derived from an L1 copy are kept per copy and start row;
    loading the same copy again, elsewhere, still writes it exactly like a fresh pool."""
    weights, other = weights_of(8, 11), weights_of(4, 12)
    if pack:
        weights, other = packed(weights), packed(other)
    fresh = LoraSlotPool(SPEC, 3, 8, dtype=torch.float32, device=CPU)
    fresh.load(0, weights)
    pool = LoraSlotPool(SPEC, 3, 8, dtype=torch.float32, device=CPU)
    pool.load(0, weights)
    pool.load(1, other)
    pool.clear(0)
    pool.load(0, other)  # the copy's old rows are taken: it lands at other rows
    pool.load(2, weights)
    info = pool.slot_info(2)
    assert info is not None and info.start != 0 and info.num_bytes == weights.num_bytes
    assert torch.equal(delta(pool, 2), delta(fresh, 0))
    pool.check_integrity()


def test_a_resident_slot_does_not_keep_its_l1_copy_alive() -> None:
    """Evicting an L1 copy frees its tensors even while its adapter stays in a slot."""
    weights = packed(weights_of(8, 13))
    pool = LoraSlotPool(SPEC, 2, 8, dtype=torch.float32, device=CPU)
    pool.load(0, weights)
    want = delta(pool, 0)
    copy, rows = weakref.ref(weights), weakref.ref(weights.runs[0].rows)
    del weights
    gc.collect()
    assert copy() is None and rows() is None
    assert torch.equal(delta(pool, 0), want)
    pool.load(1, packed(weights_of(8, 13)))  # an equal copy, a new object: checked again
    assert torch.equal(delta(pool, 1), want)
    pool.check_integrity()


@pytest.mark.parametrize(("source", "target", "num_rows"), [(5, 4, 11), (12, 0, 4), (9, 2, 7)])
def test_arena_rows_move_down_without_mixing_overlaps(
    source: int, target: int, num_rows: int
) -> None:
    store = ArenaStore(SPEC, ("q_proj", "down_proj"), 24, 4, dtype=torch.float32, device=CPU)
    for stack in store.stacks.values():
        stack.copy_(torch.randn(stack.shape))
    before = {m: s.clone() for m, s in store.stacks.items()}
    store.move_rows(source, target, num_rows)
    for module, stack in store.stacks.items():
        old = before[module]
        torch.testing.assert_close(
            stack[:, target : target + num_rows], old[:, source : source + num_rows]
        )
        vacated = stack[:, max(target + num_rows, source) : source + num_rows]
        assert not vacated.any()
        torch.testing.assert_close(stack[:, source + num_rows :], old[:, source + num_rows :])
        torch.testing.assert_close(stack[:, :target], old[:, :target])


def test_loads_written_in_pieces_equal_whole_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every arena write cut into 7-element pieces (as large adapters are on the CPU),
    loads, replacements, compaction and clears leave the same arenas and free rows zero."""
    from loraplex.model import buffers

    def run() -> list[torch.Tensor]:
        pool = LoraSlotPool(SPEC, 3, 16, dtype=torch.float32, device=CPU)
        for slot, rank in enumerate((16, 4, 8)):
            pool.load(slot, weights_of(rank, 20 + slot))
        pool.clear(1)
        pool.load(1, packed(weights_of(16, 30)))  # needs compaction
        pool.load(0, weights_of(4, 31))  # replaces an occupant
        pool.check_integrity()
        return [delta(pool, slot) for slot in range(3)]

    whole = run()
    monkeypatch.setattr(buffers, "SERIAL_NUMEL", 7)
    pieces = run()
    for a, b in zip(whole, pieces, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("pack", [False, True])
def test_a_replacement_lands_at_its_predecessors_start_when_it_fits(
    pack: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two slots whose occupants take turns (ranks 8 <-> 16 and 8 <-> 4) keep their rows: no
    compaction, every free row zero, and each slot computes exactly what a fresh pool does."""
    wrap = packed if pack else (lambda w: w)
    adapters = [wrap(weights_of(rank, 40 + i)) for i, rank in enumerate((8, 8, 16, 4))]
    pool = LoraSlotPool(SPEC, 2, 16, dtype=torch.float32, device=CPU)
    pool.load(0, adapters[0])
    pool.load(1, adapters[1])
    pool.load(0, adapters[2])  # rows 0..16 are not free: the first fit, 16..32

    def no_compaction() -> int:
        raise AssertionError("compacted")

    monkeypatch.setattr(pool, "_compact", no_compaction)
    starts = []
    for slot, index in ((0, 0), (1, 3), (0, 2), (1, 1), (0, 0), (1, 3)):
        weights = adapters[index]
        pool.load(slot, weights)
        pool.check_integrity()
        info = pool.slot_info(slot)
        assert info is not None
        starts.append((slot, info.start))
        fresh = LoraSlotPool(SPEC, 1, 16, dtype=torch.float32, device=CPU)
        fresh.load(0, weights)
        assert torch.equal(delta(pool, slot), delta(fresh, 0))
    assert starts == [(0, 16), (1, 8), (0, 16), (1, 8), (0, 16), (1, 8)]


def test_a_re_published_view_keeps_its_row_views() -> None:
    """A load re-publishes the tables it touches with the new slot table; the views cached per
    row range (the same arena rows whatever slot holds them) carry over."""
    pool = LoraSlotPool(SPEC, 2, 8, dtype=torch.float32, device=CPU)
    pool.load(0, weights_of(8, 50))
    before = pool.module_weights(0, "q_proj")
    first = before.pair(before.slots[0])
    pool.load(1, weights_of(4, 51))
    after = pool.module_weights(0, "q_proj")
    assert after is not before and after.slots != before.slots
    assert (after.lora_a, after.lora_b, after.table_index) == (
        before.lora_a,
        before.lora_b,
        before.table_index,
    )
    assert after.pair(after.slots[0]) is first
    pool.check_integrity()


@pytest.mark.parametrize("pack", [False, True])
def test_a_replacement_at_the_same_start_zeroes_only_what_it_does_not_write(pack: bool) -> None:
    """A replacement at its predecessor's start leaves the rows it overwrites in every layer
    to the write: arenas, owners and scales equal a pool that cleared the slot first, with
    occupants that target fewer layers, other modules or lower ranks."""
    wrap = packed if pack else (lambda w: w)
    sequence = [
        wrap(weights_of(16, 60)),
        wrap(weights_of(8, 61, layers=(0,))),  # layer 1 untargeted: nothing counted written
        wrap(weights_of(16, 62, modules=("q_proj", "v_proj"))),
        wrap(weights_of(4, 63)),  # down_proj rows 4..16 of the rank-16 predecessor remain
        wrap(weights_of(12, 64, modules=("down_proj",))),
        wrap(weights_of(16, 65)),
    ]
    pool = LoraSlotPool(SPEC, 2, 16, dtype=torch.float32, device=CPU)
    cleared = LoraSlotPool(SPEC, 2, 16, dtype=torch.float32, device=CPU)
    for p in (pool, cleared):
        p.load(1, weights_of(16, 66))
    for weights in sequence:
        cleared.clear(0)
        for p in (pool, cleared):
            p.load(0, weights)
            p.check_integrity()
            info = p.slot_info(0)
            assert info is not None and info.start == 16  # the same start each time
        for a, b in zip(snapshot(pool), snapshot(cleared), strict=True):
            assert torch.equal(a, b)


def test_copies_of_one_adapter_share_placements() -> None:
    """A fresh L1 copy of an adapter (another object, the same layout and scales) finds its
    placements made; another scale is another layout."""
    store = LoraSlotPool(SPEC, 2, 16, dtype=torch.float32, device=CPU)._store
    first, second = packed(weights_of(8, 70)), packed(weights_of(8, 70))
    other = packed(weights_of(8, 71))  # scale 72.0 instead of 71.0
    plans = [store.plan(w, 16) for w in (first, second, other)]
    assert plans[0] is not plans[1] and plans[0].layout == plans[1].layout != plans[2].layout
    placed = store.place(plans[0], first, 8)
    assert store.place(plans[1], second, 8) is placed
    assert store.place(plans[2], other, 8) is not placed
    assert store.place(plans[0], first, 0) is not placed


def test_prepare_reuses_last_batch_until_slots_layout_or_backend_change() -> None:
    pool = LoraSlotPool(SPEC, 3, 16, dtype=torch.float32, device=CPU, backend="auto")
    pool.load(0, weights_of(4, 1))
    pool.load(1, weights_of(4, 2))
    caller = torch.tensor([0, 1, -1])
    first = pool.prepare(caller)
    assert pool.prepare(torch.tensor([0, 1, -1])) is first  # a new tensor, equal slots
    caller.fill_(1)  # the caller reuses its tensor: the kept batch holds its own copy
    assert torch.equal(first.token_slots, torch.tensor([0, 1, -1]))
    other = pool.prepare(caller)
    assert other is not first and torch.equal(other.token_slots, caller)
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(3))
    before = pool.apply(0, "q_proj", x, torch.zeros(3, 32), pool.prepare(torch.tensor([1, 1, 1])))
    pool.clear(1)  # a new layout: slot 1's tokens now get the base output only
    after = pool.prepare(torch.tensor([1, 1, 1]))
    assert after.adds_nothing and bool(before.abs().sum() > 0)
    pool.load(1, weights_of(4, 5))
    reloaded = pool.prepare(torch.tensor([1, 1, 1]))
    assert not reloaded.adds_nothing
    assert not torch.equal(pool.apply(0, "q_proj", x, torch.zeros(3, 32), reloaded), before)
    pool.backend = get_backend("reference")
    assert pool.prepare(torch.tensor([1, 1, 1])) is not reloaded
    with pytest.raises(ValueError, match="outside"):
        pool.prepare(torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="outside"):  # a refused one is never kept
        pool.prepare(torch.tensor([0, 3]))


@pytest.mark.parametrize("pack", [False, True])
def test_a_load_into_a_free_slot_re_publishes_exactly_its_tables(pack: bool) -> None:
    """Into a free slot (nothing replaced, nothing compacted) a load records its rows and
    re-publishes the tables it writes in one pass: those views are new and name its rows, every
    other table keeps its published view, and the layout is a new one."""
    pool = LoraSlotPool(SPEC, 3, 8, dtype=torch.float32, device=CPU)
    pool.load(0, weights_of(8, 60, modules=("v_proj",)))
    tables = [(layer, m) for layer in range(2) for m in TARGET_MODULES]
    before = {t: pool.module_weights(*t) for t in tables}
    layout = pool.layout
    weights = weights_of(4, 61, modules=("q_proj", "down_proj"), layers=(1,))
    pool.load(2, packed(weights) if pack else weights)
    info = pool.slot_info(2)
    assert info is not None and pool.layout is not layout
    for table in tables:
        after = pool.module_weights(*table)
        if table in {(1, "q_proj"), (1, "down_proj")}:
            assert after is not before[table]
            assert after.slots[2] == SlotRows(info.start, 4, 62.0)
            assert after.slots[:2] == before[table].slots[:2]
        else:
            assert after is before[table], table
    pool.check_integrity()
    assert delta(pool, 2).abs().sum() == 0  # layer 0's q_proj: not targeted by slot 2
