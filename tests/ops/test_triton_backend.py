"""The triton backend equals the reference op, run by Triton's CPU interpreter on CPU tensors.

Triton picks interpreter or GPU compilation when a function is decorated, and decorates its own
library (``tl.zeros`` ...) when triton is first imported, so this module sets
``TRITON_INTERPRET=1`` before anything imports triton, for the rest of the process (pytest runs
other tests in it: only triton users are affected, and on a CPU machine they need it too). The
GPU check runs in a fresh process without it, so that the kernels compile for real.
"""

from __future__ import annotations

import importlib
import os
import random
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.model.adapter_weights import AdapterWeights, ModuleWeights
from loraplex.model.lora import LoraSlotPool
from loraplex.ops import Strategy, get_backend
from loraplex.ops.triton_ops import KERNELS_MODULE, TritonBackend, TritonBatch, block_table

REPO_ROOT = Path(__file__).resolve().parents[2]
HAS_TRITON = find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
# hidden 64, MLP 160 (not a power of two: ragged tiles; up_proj's 160 outputs span two output
# tiles of 128, down_proj's 160 inputs two reduction tiles), q 64 / kv 32 wide, 2 layers.
SPEC = BaseModelSpec("tiny", "LlamaForCausalLM", 64, 160, 2, 4, 2, 16, 64, "0" * 64)
MODULES = ("q_proj", "v_proj", "down_proj", "up_proj")
NUM_SLOTS = 8
RANK_MIXES = {"r8": (8,), "S2": (64, 32, 16, 8), "wide": (4, 128)}
PATTERNS = ("identical", "distinct", "zipf")


def interpreted_kernels() -> ModuleType | None:
    """The kernels module, in interpreter mode unless triton came into this process without it."""
    if not HAS_TRITON:
        return None
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"  # read when triton and the kernels are decorated
    return importlib.import_module(KERNELS_MODULE)


KERNELS = interpreted_kernels()
needs_interpreter = pytest.mark.skipif(
    KERNELS is None or not KERNELS.INTERPRETED,
    reason="triton is missing, or was imported in this process before TRITON_INTERPRET was set",
)


def adapter(rank: int, seed: int, modules: tuple[str, ...] = MODULES) -> AdapterWeights:
    """Random pairs; layer 1 has half the rank (a module narrower than the slot's rows)."""
    gen = torch.Generator().manual_seed(seed)
    pairs = []
    for layer in range(SPEC.num_layers):
        layer_rank = rank if layer == 0 else max(1, rank // 2)
        for module in modules:
            d_in, d_out = SPEC.module_shape(module)
            lora_a = torch.randn(layer_rank, d_in, generator=gen) / d_in**0.5
            lora_b = torch.randn(d_out, layer_rank, generator=gen)
            pairs.append(ModuleWeights(layer, module, lora_a, lora_b, 0.5 + seed * 0.25))
    return AdapterWeights(f"{seed:064x}", torch.float32, tuple(pairs))


def pools(
    ranks: dict[int, int], *, dtype: torch.dtype = torch.float32, modules: tuple[str, ...] = MODULES
) -> tuple[LoraSlotPool, LoraSlotPool]:
    """A triton pool and a reference pool holding the same adapter in each slot of ``ranks``."""
    made = []
    for backend in ("triton", "reference"):
        pool = LoraSlotPool(
            SPEC, NUM_SLOTS, 128, dtype=dtype, device=torch.device("cpu"), backend=backend
        )
        for slot, rank in ranks.items():
            pool.load(slot, adapter(rank, slot, modules))
        made.append(pool)
    return made[0], made[1]


def compare(
    pools_: tuple[LoraSlotPool, LoraSlotPool], slots: list[int], *, seed: int = 0
) -> list[torch.Tensor]:
    """Run every (layer, module) on both pools; asserts agreement, returns the triton deltas."""
    triton_pool, reference_pool = pools_
    token_slots = torch.tensor(slots, dtype=torch.int64)
    gen = torch.Generator().manual_seed(seed)
    got_batch, want_batch = triton_pool.prepare(token_slots), reference_pool.prepare(token_slots)
    deltas = []
    occupied = set(triton_pool.occupied_slots())
    for layer in range(SPEC.num_layers):
        for module in MODULES:
            d_in, d_out = SPEC.module_shape(module)
            x = torch.randn(len(slots), 2 * d_in, generator=gen)[:, ::2]  # strided rows
            base = torch.randn(len(slots), d_out, generator=gen)
            got = triton_pool.apply(layer, module, x, base.clone(), got_batch)
            want = reference_pool.apply(layer, module, x, base.clone(), want_batch)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            untouched = [t for t, s in enumerate(slots) if s < 0 or s not in occupied]
            assert torch.equal(got[untouched], base[untouched])  # bit-exact, never rewritten
            deltas.append(got - base)
    return deltas


def sample_slots(
    pattern: str, num_tokens: int, occupied: list[int], rng: random.Random
) -> list[int]:
    if pattern == "identical":
        return [occupied[0]] * num_tokens
    if pattern == "distinct":
        return [occupied[i % len(occupied)] for i in range(num_tokens)]
    weights = [1.0 / (i + 1) for i in range(len(occupied))]
    return rng.choices(occupied, weights=weights, k=num_tokens)


@needs_interpreter
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("mix", sorted(RANK_MIXES))
def test_matches_reference_over_popularity_and_rank_mixes(pattern: str, mix: str) -> None:
    """Slots 0, 2, 4, 6 hold adapters, odd slots stay empty; -1 and empty-slot tokens ride along."""
    ranks = {slot: RANK_MIXES[mix][i % len(RANK_MIXES[mix])] for i, slot in enumerate((0, 2, 4, 6))}
    rng = random.Random(f"{pattern}-{mix}")
    slots = [*sample_slots(pattern, 20, sorted(ranks), rng), -1, 5]
    rng.shuffle(slots)
    deltas = compare(pools(ranks), slots, seed=len(slots))
    assert all(bool(d.abs().sum() > 0) for d in deltas)  # every module got a real delta


@needs_interpreter
def test_single_token_and_prefill_runs() -> None:
    ranks = {1: 16, 3: 64}
    compare(pools(ranks), [3], seed=1)
    compare(pools(ranks), [1] * 37 + [-1] * 3 + [3] * 18, seed=2)  # blocks of 16, ragged tails


@needs_interpreter
def test_module_a_slot_does_not_target_is_left_alone() -> None:
    """Slot 0 targets q_proj only (rank 0 on v_proj and down_proj); slot 1 targets all three."""
    triton_pool, reference_pool = pools({1: 8})
    for pool in (triton_pool, reference_pool):
        pool.load(0, adapter(32, 0, modules=("q_proj",)))
    deltas = compare((triton_pool, reference_pool), [0, 1, 0, 0, 1], seed=3)
    for delta, module in zip(deltas, MODULES * SPEC.num_layers, strict=True):
        assert bool(delta[[0, 2, 3]].any()) is (module == "q_proj")


@needs_interpreter
@settings(max_examples=8, deadline=None)
@given(
    ranks=st.dictionaries(st.integers(0, NUM_SLOTS - 1), st.integers(1, 128), max_size=5),
    picks=st.lists(st.integers(-1, NUM_SLOTS - 1), min_size=1, max_size=40),
)
def test_matches_reference_for_any_assignment(ranks: dict[int, int], picks: list[int]) -> None:
    compare(pools(ranks), picks, seed=len(picks))


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_close_to_float32(dtype: torch.dtype) -> None:
    ranks = {0: 64, 1: 8, 2: 16}
    slots = torch.tensor([0, 1, 2, -1, 2, 0, 1, 0])
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(4))
    results = []
    for pool_dtype in (torch.float32, dtype):
        pool, _ = pools(ranks, dtype=pool_dtype)
        out = torch.zeros(8, 64, dtype=pool_dtype)
        results.append(pool.apply(0, "q_proj", x.to(pool_dtype), out, pool.prepare(slots)).float())
    full, half = results
    assert torch.equal(half[3], torch.zeros(64))  # the base-only token
    adapted = [0, 1, 2, 4, 5, 6, 7]
    error = (half[adapted] - full[adapted]).norm(dim=1) / full[adapted].norm(dim=1)
    assert error.max().item() < 0.02, error


class LaunchSpy:
    """Counts launches of one kernel and forwards them (or drops them when ``run`` is False)."""

    def __init__(self, kernel: Any, *, run: bool = True) -> None:
        self.kernel, self.run = kernel, run
        self.grids: list[tuple[int, ...]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        self.grids.append(grid)
        return self.kernel[grid] if self.run else lambda *args, **kwargs: None


def spied_backend(pool: LoraSlotPool, *, run: bool) -> SimpleNamespace:
    assert isinstance(pool.backend, TritonBackend) and KERNELS is not None
    spies = SimpleNamespace(
        lora_kernel=LaunchSpy(KERNELS.lora_kernel, run=run),
        INTERPRETED=KERNELS.INTERPRETED,
    )
    pool.backend.kernels = spies  # type: ignore[assignment]
    return spies


@needs_interpreter
def test_one_launch_per_module_and_no_other_path() -> None:
    """The delta comes from the kernels alone: dropping their launches leaves ``out`` as it was."""
    triton_pool, reference_pool = pools({0: 4, 1: 128, 2: 16})
    assert KERNELS is not None and type(KERNELS.lora_kernel).__name__ == "InterpretedFunction"
    slots = torch.tensor([2, 0, 1, 1, 0, 2] * 9 + [-1])  # scattered; 18 per slot: 2 blocks each
    batch = triton_pool.prepare(slots)
    assert isinstance(batch, TritonBatch) and batch.order is not None
    x, base = torch.randn(55, 160), torch.randn(55, 64)
    spies = spied_backend(triton_pool, run=True)
    got = triton_pool.apply(0, "down_proj", x, base.clone(), batch)
    want = reference_pool.apply(0, "down_proj", x, base.clone(), reference_pool.prepare(slots))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert spies.lora_kernel.grids == [(6, 1)]  # 6 blocks x (d_out 64 in one tile)
    spied_backend(triton_pool, run=False)
    assert torch.equal(triton_pool.apply(0, "down_proj", x, base.clone(), batch), base)


def test_block_table_is_rank_exact_and_cut_in_blocks() -> None:
    pool = LoraSlotPool(
        SPEC, NUM_SLOTS, 128, dtype=torch.float32, device=torch.device("cpu"), backend="grouped"
    )
    pool.load(0, adapter(4, 0))
    pool.load(1, adapter(128, 1))
    layout = pool.layout
    batch = pool.backend.prepare(torch.tensor([1] * 40 + [0] * 3), layout)
    rows = block_table(batch.segments, layout)
    start0, start1 = layout.slot_starts[0], layout.slot_starts[1]
    assert rows == [
        (0, 16, start1, 128),
        (16, 32, start1, 128),
        (32, 40, start1, 128),
        (40, 43, start0, 4),  # rank 4 reads 4 rows, not the widest slot's 128
    ]


@needs_interpreter
def test_apply_refuses_foreign_batches_and_mismatched_inputs() -> None:
    triton_pool, _ = pools({0: 8})
    masked = get_backend("masked").prepare(torch.tensor([0, 0]), triton_pool.layout)
    x, out = torch.randn(2, 64), torch.zeros(2, 64)
    with pytest.raises(ValueError, match="triton backend"):
        triton_pool.apply(0, "q_proj", x, out, masked)
    batch = triton_pool.prepare(torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="x has dtype"):
        triton_pool.apply(0, "q_proj", x.double(), out, batch)
    with pytest.raises(ValueError, match="out has shape"):
        triton_pool.apply(0, "q_proj", x, torch.zeros(3, 64), batch)
    assert triton_pool.prepare(torch.tensor([-1, 3])).strategy is Strategy.NONE


@needs_interpreter
def test_cpu_tensors_need_the_interpreter() -> None:
    triton_pool, _ = pools({0: 8})
    spied_backend(triton_pool, run=True).INTERPRETED = False
    batch = triton_pool.prepare(torch.tensor([0]))
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        triton_pool.apply(0, "q_proj", torch.randn(1, 64), torch.zeros(1, 64), batch)


def test_importing_ops_does_not_import_triton() -> None:
    code = "import sys, loraplex.ops as o; o.get_backend('masked'); print('triton' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "False"


def test_missing_triton_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "triton", None)  # makes `import triton` fail
    monkeypatch.delitem(sys.modules, KERNELS_MODULE, raising=False)
    with pytest.raises(ModuleNotFoundError, match="needs the 'triton' package") as caught:
        get_backend("triton")
    assert caught.value.name == "triton"


# Run in a fresh process: importing this test module would switch the interpreter on.
GPU_CHECK = """
import torch
from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.model.adapter_weights import AdapterWeights, ModuleWeights
from loraplex.model.lora import LoraSlotPool
from loraplex.ops.triton_kernels import INTERPRETED

assert not INTERPRETED, "TRITON_INTERPRET is set: the GPU check would not compile anything"
spec = BaseModelSpec("tiny", "LlamaForCausalLM", 256, 384, 1, 8, 2, 32, 64, "0" * 64)
gen = torch.Generator().manual_seed(0)
adapters = []
for seed, rank in enumerate((64, 16, 8, 128)):
    pairs = []
    for module in ("q_proj", "down_proj"):
        d_in, d_out = spec.module_shape(module)
        a = torch.randn(rank, d_in, generator=gen) / d_in**0.5
        pairs.append(ModuleWeights(0, module, a, torch.randn(d_out, rank, generator=gen), 0.5))
    adapters.append(AdapterWeights(f"{seed:064x}", torch.float32, tuple(pairs)))
slots = torch.tensor([0, 1, 2, 3, -1] * 7 + [2] * 40)
for dtype, tolerance in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
    made = {}
    for device, backend in (("cpu", "reference"), ("cuda", "triton")):
        pool = LoraSlotPool(spec, 4, 128, dtype=dtype, device=torch.device(device), backend=backend)
        for slot, weights in enumerate(adapters):
            pool.load(slot, weights)
        made[device] = pool
    for module in ("q_proj", "down_proj"):
        d_in, d_out = spec.module_shape(module)
        x = torch.randn(len(slots), d_in, generator=gen).to(dtype)
        base = torch.randn(len(slots), d_out, generator=gen).to(dtype)
        want = made["cpu"].apply(0, module, x, base.clone(), made["cpu"].prepare(slots))
        got = made["cuda"].apply(
            0, module, x.cuda(), base.cuda(), made["cuda"].prepare(slots.cuda())
        ).cpu()
        torch.cuda.synchronize()
        scale = (want.float() - base.float()).norm(dim=1, keepdim=True).clamp_min(1e-6)
        error = ((got.float() - want.float()) / scale).abs().max().item()
        assert error < tolerance, (dtype, module, error)
print("ok")
"""


@pytest.mark.gpu
@needs_triton
def test_compiled_kernels_on_cuda_match_the_cpu_reference() -> None:
    """Compiled (not interpreted) kernels on a real GPU, float32 and bfloat16."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", GPU_CHECK],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip() == "ok"
