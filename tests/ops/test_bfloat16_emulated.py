"""``auto`` on a CPU without native bfloat16 arithmetic (docs/modes.md, twentieth pass).

On an AVX2-only AMD EPYC Milan (no avx512_bf16, no amx_bf16), bfloat16 masked steps ran at
0.20-0.29 of the best forced strategy's speed where the terms fitted on AMX / avx512_bf16 CPUs
chose masked; these pin the capability-aware rule with a fake capability (a written cpuinfo, or
``bfloat16_emulated`` passed in), so they read the same on any CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_backends import SPEC, filled_pool
from test_batched import SKEWED16, SKEWED20

from loraplex.cpuinfo import NATIVE_BFLOAT16_FLAGS, bfloat16_emulated, cpu_flags
from loraplex.model.lora import LoraSlotPool
from loraplex.ops import AutoBackend, AutoPolicy, Strategy
from loraplex.ops.policy import StepShape

MILAN_FLAGS = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi2 vaes vpclmulqdq"
# bench modes' 20-sequence uniform16 decode step (sequence i on slot i mod 16), bfloat16 on a
# CPU: StepShape.of on the bench's small-preset pool (width 642)
UNIFORM20 = StepShape(
    20, 16, 480, 480, 600, 480, 960, True, False, 4, 20, float32_runs=16, float32_rows=480,
    float32_cells=600, adapter_tokens=20,
)  # fmt: skip


def emulated(shape: StepShape) -> StepShape:
    return StepShape(**{**shape.__dict__, "half_emulated": True})


def write_cpuinfo(path: Path, field: str, value: str) -> Path:
    path.write_text(f"processor\t: 0\nvendor_id\t: AuthenticAMD\n{field}\t\t: {value}\n\n")
    return path


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("flags", MILAN_FLAGS, True),  # AVX2 only
        ("flags", MILAN_FLAGS + " avx512f avx512_bf16", False),  # Zen 4 / Cooper Lake on
        ("flags", MILAN_FLAGS + " avx512f amx_tile amx_bf16", False),  # Sapphire Rapids on
        ("flags", "", False),  # no flags read: today's costs
        ("Features", "fp asimd bf16", False),  # aarch64 names: not read, today's costs
    ],
)
def test_the_capability_is_read_off_cpuinfo_flags(
    tmp_path: Path, field: str, value: str, expected: bool
) -> None:
    flags = cpu_flags(write_cpuinfo(tmp_path / "cpuinfo", field, value))
    assert bfloat16_emulated(flags) is expected


def test_the_native_flags_are_linux_names_and_an_unreadable_cpuinfo_keeps_todays_costs(
    tmp_path: Path,
) -> None:
    for flag in sorted(NATIVE_BFLOAT16_FLAGS):  # Linux's names: avx512_bf16, amx_bf16
        assert not bfloat16_emulated(frozenset({"avx2", flag}))
    # AVX-512 without its bfloat16 instructions (Skylake-X, Ice Lake) is still emulated
    assert bfloat16_emulated(frozenset({"avx2", "avx512f", "avx512bw"}))
    assert cpu_flags(tmp_path / "missing") == frozenset()
    assert not bfloat16_emulated(frozenset())


@pytest.mark.parametrize("width", [642, 2597])  # the small and large presets' mean widths
@pytest.mark.parametrize("shape", [SKEWED20, SKEWED16, UNIFORM20], ids=["s20", "s16", "u20"])
def test_emulated_bfloat16_steps_leave_masked(shape: StepShape, width: int) -> None:
    """Measured on the Milan (scripts/lora-strategy/runs.jsonl): masked 3.5-5.3x the step time
    of grouped on every 16-32-sequence decode step; the float32 pass or grouped fastest."""
    policy = AutoPolicy()
    choice = policy.choose(emulated(shape), width)
    assert choice is Strategy.GROUPED
    assert policy.grouped_in_float32(emulated(shape), width)
    # a CPU with native bfloat16 keeps today's choice (masked on the 20-sequence steps)
    if shape is not SKEWED16:
        assert policy.choose(shape, width) is Strategy.MASKED
    # the emulated cost is the factor: at 1 (a multiply-add as dear as float32's) masked
    # wins the uniform step again, with no AMX rate
    if shape is UNIFORM20:
        assert AutoPolicy(emulated_mac_factor=1).choose(emulated(shape), width) is Strategy.MASKED


def test_the_emulated_factor_leaves_native_and_float32_costs_alone() -> None:
    big = AutoPolicy(emulated_mac_factor=1000)
    for shape in (SKEWED20, SKEWED16, UNIFORM20, StepShape(16, 16, 480, 480, 480)):
        for width in (642, 2597):
            assert big.choose(shape, width) is AutoPolicy().choose(shape, width)
            assert big.grouped_in_float32(shape, width) is AutoPolicy().grouped_in_float32(
                shape, width
            )
    with pytest.raises(ValueError, match="emulated_mac_factor -1 is invalid"):
        AutoPolicy(emulated_mac_factor=-1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_step_shape_marks_only_bfloat16_on_a_cpu_as_emulated(dtype: torch.dtype) -> None:
    _, adapters = filled_pool("auto", [16] * 8)
    pool = LoraSlotPool(SPEC, 8, 64, dtype=dtype, device=torch.device("cpu"))
    for slot, weights in enumerate(adapters):
        pool.load(slot, weights)
    tokens = {slot: 2 for slot in range(8)}
    shape = StepShape.of(16, tokens, pool.layout, 16, bfloat16_emulated=True)
    assert shape.half_emulated is (dtype == torch.bfloat16)
    assert not StepShape.of(16, tokens, pool.layout, 16, bfloat16_emulated=False).half_emulated


def test_auto_backend_takes_the_capability() -> None:
    """The same bfloat16 step: masked where bfloat16 is native, grouped through the float32 pass
    where it is emulated (the float32 pass's results: tests/ops/test_float32_pass.py)."""
    _, adapters = filled_pool("auto", [16] * 8)
    half = LoraSlotPool(SPEC, 8, 64, dtype=torch.bfloat16, device=torch.device("cpu"))
    for slot, weights in enumerate(adapters):
        half.load(slot, weights)
    slots = [0] * 12 + [1, 2, 3, 4]
    token_slots = torch.tensor(slots)
    # the tiny spec (width 103) is launch-bound: launches and calls left out, the work decides
    policy = AutoPolicy(launch_macs=0, half_cpu_call_macs=0)
    native = AutoBackend(policy, bfloat16_emulated=False).prepare(token_slots, half.layout)
    emulated_batch = AutoBackend(policy, bfloat16_emulated=True).prepare(token_slots, half.layout)
    assert native.strategy is Strategy.MASKED
    assert emulated_batch.strategy is Strategy.GROUPED and emulated_batch.float32
