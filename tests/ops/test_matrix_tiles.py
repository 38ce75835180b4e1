"""Masked's faster 16-bit rate only on a CPU with AMX's matrix tiles (docs/modes.md,
twenty-second pass).

On a Zen 4 EPYC (avx512_bf16, no AMX) the merged step of ``bench modes``' replay that carries
another revision's 64-token prompt went masked (its half-rate term fitted on an Intel Xeon with
AMX) at 1.2x the time of grouped. These pin the rule with the capability passed in or faked, so
they read the same on any CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_backends import SPEC, filled_pool

from loraplex.bench.modes.setup import HOT, ModesBenchConfig, Setup
from loraplex.cpuinfo import MATRIX_TILE_FLAG, matrix_tiles
from loraplex.model.lora import LoraSlotPool
from loraplex.ops import AutoPolicy, Strategy
from loraplex.ops.merged_op import fused_plan
from loraplex.ops.policy import StepShape

ZEN4 = frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni"})
# StepShape.of on bench modes' small-preset pool (width 642), bfloat16 on a CPU: the foreign
# tokens of a merged replay step, a 64-token prompt of slot 5 and one decode token each of
# slots 3, 7, 11 and 14 (the hot revision's tokens are merged: not in the shape) ...
PROMPT = StepShape(68, 5, 360, 120, 2136, 120, 2136, True, False, 3, 68)
# ... and of a merged decode step: those four decode tokens alone
DECODE = StepShape(4, 4, 360, 88, 88, 88, 88, True, False, 2, 4)


def test_matrix_tiles_reads_the_amx_flag() -> None:
    assert matrix_tiles(ZEN4 | {"amx_bf16", MATRIX_TILE_FLAG})
    assert not matrix_tiles(ZEN4)  # native bfloat16 dot products, no tiles
    assert matrix_tiles(frozenset())  # nothing read: the costs fitted with tiles


def tiles(shape: StepShape, on: bool) -> StepShape:
    return StepShape(**{**shape.__dict__, "half_tiles": on})


def test_without_tiles_a_merged_prompt_step_goes_grouped() -> None:
    policy = AutoPolicy()
    assert policy.masked(tiles(PROMPT, True), 642)  # the rate measured with AMX
    assert not policy.masked(tiles(PROMPT, False), 642)
    # decode-sized steps stay masked either way (their rows are few against the calls saved)
    assert policy.masked(tiles(DECODE, True), 642) and policy.masked(tiles(DECODE, False), 642)


@pytest.fixture(scope="module")
def half_setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    config = ModesBenchConfig(batch_size=4, context_tokens=8, dtype="bfloat16")
    return Setup(Path(tmp_path_factory.mktemp("tiles")), config)


@pytest.mark.parametrize(("on", "expected"), [(True, Strategy.MASKED), (False, Strategy.GROUPED)])
def test_the_merged_plan_reads_this_cpu_s_tiles(
    half_setup: Setup, monkeypatch: pytest.MonkeyPatch, on: bool, expected: Strategy
) -> None:
    monkeypatch.setattr("loraplex.ops.policy.this_cpu_matrix_tiles", lambda: on)
    layout = half_setup.pool.layout
    token_slots = torch.tensor([HOT] * 15 + [3, 7, 11, 14] + [5] * 64)
    assert StepShape.of(68, {5: 64, 3: 1, 7: 1, 11: 1, 14: 1}, layout).half_tiles is on
    assert fused_plan(token_slots, HOT, layout, "auto").strategy is expected


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_only_16_bit_weights_on_a_cpu_take_the_tiles_term(dtype: torch.dtype) -> None:
    _, adapters = filled_pool("auto", [16] * 4)
    pool = LoraSlotPool(SPEC, 4, 64, dtype=dtype, device=torch.device("cpu"))
    for slot, weights in enumerate(adapters):
        pool.load(slot, weights)
    shape = StepShape.of(8, {slot: 2 for slot in range(4)}, pool.layout, matrix_tiles=True)
    assert shape.half_tiles is (dtype != torch.float32)
    assert not StepShape.of(8, {0: 8}, pool.layout, matrix_tiles=False).half_tiles
