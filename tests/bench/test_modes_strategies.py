"""The modes bench's strategy check (``strategies`` in bench/modes/figures.py): ``auto`` is
judged against every computation the unmerged op can run, grouped's float32 pass included
(docs/modes.md, "Twenty-second pass": without it the check called a 1.24-1.30x slower pick
fine). Throughput is stubbed: these tests check the structure, never a timing."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.bench.modes import figures
from loraplex.bench.modes.setup import BackendView, GroupedFloat32, Setup
from loraplex.model.adapter_weights import AdapterWeights, ModuleWeights
from loraplex.model.llama import LoraApplier
from loraplex.model.lora import LoraSlotPool
from loraplex.ops import AutoBackend, AutoPolicy, Strategy

SPEC = BaseModelSpec("tiny", "LlamaForCausalLM", 48, 80, 2, 4, 2, 12, 64, "0" * 64)
NUM_SLOTS = 8
GROUPED = AutoPolicy(min_runs_for_masked=NUM_SLOTS + 1)  # auto never picks masked
SKEWED = [2] * 13 + [0, 5, 7]  # a decode step: every run at most FLOAT32_MAX_TOKENS


def bfloat16_pool() -> LoraSlotPool:
    pool = LoraSlotPool(SPEC, NUM_SLOTS, 64, dtype=torch.bfloat16, device=torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    for slot in range(NUM_SLOTS):
        pairs = []
        for layer in range(SPEC.num_layers):
            d_in, d_out = SPEC.module_shape("q_proj")
            a, b = torch.randn(8, d_in, generator=gen), torch.randn(d_out, 8, generator=gen)
            pairs.append(ModuleWeights(layer, "q_proj", a, b, 0.5))
        pool.load(slot, AdapterWeights(f"{slot:064x}", torch.float32, tuple(pairs)))
    return pool


def stub_setup(dtype: torch.dtype) -> Setup:
    layout = SimpleNamespace(row_scale=torch.zeros(4, dtype=dtype))
    return SimpleNamespace(pool=SimpleNamespace(layout=layout))  # type: ignore[return-value]


Variants = dict[str, tuple[list[int | None], LoraApplier | None]]


def stub_throughput(
    tokens_per_s: dict[str, float], seen: list[set[str]]
) -> Callable[[Setup, Variants], dict[str, float]]:
    """``figures.throughput`` answering ``tokens_per_s``, noting which variants it timed."""

    def throughput(setup: Setup, variants: Variants) -> dict[str, float]:
        seen.append(set(variants))
        return {name: tokens_per_s[name] for name in variants}

    return throughput


def test_the_check_divides_by_the_fastest_of_every_forced_strategy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """16-bit weights on a CPU: the forced set has grouped through its float32 pass, and where
    that is the fastest, ``auto`` is measured against it (main's check took masked/grouped's
    best: 140/110 here, a slower ``auto`` called faster)."""
    tps = {"masked": 100.0, "grouped": 110.0, "batched": 90.0, "grouped_float32": 140.0}
    tps["auto"] = 112.0
    seen: list[set[str]] = []
    monkeypatch.setattr(figures, "throughput", stub_throughput(tps, seen))
    result = figures.strategies(stub_setup(torch.bfloat16), [0, 1])
    assert seen == [{"masked", "grouped", "batched", "grouped_float32", "auto"}]  # one clock
    assert result["best_forced"] == "grouped_float32"
    assert result["auto_over_best_forced"] == pytest.approx(112.0 / 140.0)
    assert result["tokens_per_s"] == tps


def test_float32_weights_force_no_float32_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """In float32 the pass is plain grouped: not timed twice; batched can still be the best."""
    tps = {"masked": 100.0, "grouped": 110.0, "batched": 150.0, "auto": 150.0}
    seen: list[set[str]] = []
    monkeypatch.setattr(figures, "throughput", stub_throughput(tps, seen))
    result = figures.strategies(stub_setup(torch.float32), [0, 1])
    assert seen == [{"masked", "grouped", "batched", "auto"}]
    assert result["best_forced"] == "batched"
    assert result["auto_over_best_forced"] == pytest.approx(1.0)


def test_the_forced_float32_pass_is_autos_pass_on_every_step_it_can_take() -> None:
    """GroupedFloat32 builds the batch ``auto`` builds when it picks the pass (same gathered
    order, runs and dtype runs, same output), whatever the policy would pick; a single run
    stays plain grouped, and a run longer than the cap stays in the dtype."""
    pool = bfloat16_pool()
    forced, auto = GroupedFloat32(), AutoBackend(GROUPED)
    token_slots = torch.tensor(SKEWED, dtype=torch.int64)
    mine, theirs = forced.prepare(token_slots, pool.layout), auto.prepare(token_slots, pool.layout)
    assert mine.float32 and theirs.float32 and mine.dtype_runs == frozenset()
    assert torch.equal(mine.order, theirs.order) and mine.segments == theirs.segments
    x = torch.randn(len(SKEWED), SPEC.module_shape("q_proj")[0]).to(torch.bfloat16)
    out = torch.zeros(len(SKEWED), SPEC.module_shape("q_proj")[1], dtype=torch.bfloat16)
    weights = pool.module_weights(0, "q_proj")
    got = forced.apply(x, out.clone(), weights, mine)
    assert torch.equal(got, auto.apply(x, out.clone(), weights, theirs))
    long_run = forced.prepare(torch.tensor([2] * 20 + [0, 5]), pool.layout)
    assert long_run.float32 and long_run.dtype_runs == frozenset({2})
    single = forced.prepare(torch.tensor([3] * 4), pool.layout)
    assert single.strategy is Strategy.GROUPED and not single.float32


def test_the_view_names_autos_float32_pass_as_the_forced_strategy() -> None:
    """``auto_ran_as`` says ``grouped_float32`` where ``auto_chose`` says only ``grouped``."""
    pool = bfloat16_pool()
    view = BackendView(pool, AutoBackend(GROUPED))
    view.prepare(torch.tensor(SKEWED))
    assert (view.last_strategy, view.last_ran_as) == ("grouped", "grouped_float32")
    view.prepare(torch.tensor([3] * 4))
    assert (view.last_strategy, view.last_ran_as) == ("grouped", "grouped")
