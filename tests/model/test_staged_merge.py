"""A staged merge (model/staged_merge.py): the merged weights are built beside the live ones a
budgeted piece per call, nothing live changes until the commit, the commit and the unmerge are
swaps by reference (the unmerge gives back the very same tensors), and the merged weights equal
the in-place merge's bit for bit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.validate import validate_adapter_dir
from loraplex.clock import ManualClock
from loraplex.demo.assets import DemoAssets
from loraplex.model.adapter_weights import AdapterWeights, load_adapter_weights
from loraplex.model.checkpoint import load_checkpoint
from loraplex.model.layers import PackedLinear, packed_available
from loraplex.model.llama import LlamaModel
from loraplex.model.merge import (
    MAX_DELTA_RATIO,
    MergeRefusedError,
    MergeStateError,
    WeightMerger,
    linear_of,
)

MODULE_S = 0.003  # what one staged module costs on the fake clock


def load_weights(base_dir: Path, path: Path, dtype: torch.dtype) -> AdapterWeights:
    spec = BaseModelSpec.from_dir(base_dir)
    return load_adapter_weights(validate_adapter_dir(path, spec, 64), dtype=dtype)


def live(model: LlamaModel) -> dict[str, torch.Tensor]:
    """name -> the live parameter object (identity, not a copy)."""
    return dict(model.named_parameters())


def costed(model: LlamaModel, clock: ManualClock) -> None:
    """Each staged module costs ``MODULE_S`` on ``clock`` (the staging packs each one once)."""
    pack = model.pack

    def counted(weight: torch.Tensor) -> bool:
        clock.advance(MODULE_S)
        return pack(weight)

    model.pack = counted  # type: ignore[method-assign]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_staging_changes_nothing_live_and_the_unmerge_gives_back_the_same_tensors(
    demo_assets: DemoAssets, dtype: torch.dtype
) -> None:
    base_dir = demo_assets.base_model_dir
    weights = load_weights(base_dir, demo_assets.adapter("globex", "summarize", "r1").path, dtype)
    model = load_checkpoint(base_dir, dtype=dtype)
    in_place = load_checkpoint(base_dir, dtype=dtype)
    WeightMerger(in_place, staged=False).merge(weights)
    before = {name: p.clone() for name, p in model.named_parameters()}
    originals = live(model)
    clock = ManualClock()
    costed(model, clock)
    merger = WeightMerger(model, clock=clock.now)
    staging = merger.stage(weights)
    calls = 0
    while not staging.done:
        staging.advance(0.0)  # one module per call
        calls += 1
        assert all(p is originals[n] for n, p in model.named_parameters())
        assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert calls == staging.num_calls == len(weights.modules)
    merger.commit(staging)
    assert merger.merged_digest == weights.digest
    for (name, param), (_, want) in zip(
        model.named_parameters(), in_place.named_parameters(), strict=True
    ):
        assert torch.equal(param, want), name  # the in-place merge's weights, bit for bit
    for _ in range(2):  # repeated cycles: the same objects, no drift
        merger.unmerge()
        assert all(p is originals[n] for n, p in model.named_parameters())
        assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
        merger.merge(weights)
    merger.unmerge()


def test_the_budget_bounds_the_modules_staged_per_call(demo_assets: DemoAssets) -> None:
    base_dir = demo_assets.base_model_dir
    weights = load_weights(base_dir, demo_assets.adapter("globex", "summarize", "r1").path,
                           torch.float32)  # fmt: skip
    model = load_checkpoint(base_dir)
    clock = ManualClock()
    costed(model, clock)
    merger = WeightMerger(model, clock=clock.now)
    staging = merger.stage(weights)
    counts = []
    while not staging.done:
        start = clock.now()
        counts.append(staging.advance(0.010))  # 3 modules of 3 ms fit, a 4th would not
        assert clock.now() - start <= 0.010 + 1e-12
    total = len(weights.modules)
    assert counts == [3] * (total // 3) + ([total % 3] if total % 3 else [])
    assert staging.seconds == pytest.approx(total * MODULE_S)
    one = merger.stage(weights)
    assert one.advance(MODULE_S / 2) == 1  # a budget below one module: one, never none


def test_a_refusal_mid_staging_changes_nothing_live(demo_assets: DemoAssets) -> None:
    base_dir = demo_assets.base_model_dir
    weights = load_weights(base_dir, demo_assets.adapter("acme", "billing", "r1").path,
                           torch.float32)  # fmt: skip
    half = len(weights.modules) // 2
    huge = dataclasses.replace(weights.modules[half], scale=MAX_DELTA_RATIO * 1e6)
    poisoned = AdapterWeights(
        weights.digest, weights.dtype, (*weights.modules[:half], huge, *weights.modules[half + 1 :])
    )
    model = load_checkpoint(base_dir)
    before = {name: p.clone() for name, p in model.named_parameters()}
    originals = live(model)
    merger = WeightMerger(model)
    staging = merger.stage(poisoned)
    assert staging.advance(0.0) == 1
    with pytest.raises(MergeRefusedError, match=f"layer {huge.layer} {huge.module} "):
        staging.advance(float("inf"))
    staging.abandon()
    assert staging.done and merger.merged_digest is None
    with pytest.raises(RuntimeError, match="expected every module staged"):
        merger.stage(poisoned).result()
    assert all(p is originals[n] and torch.equal(p, before[n]) for n, p in model.named_parameters())
    merger.merge(weights)  # the adapter itself still merges
    with pytest.raises(MergeStateError, match="expected an unmerge first"):
        merger.stage(weights)
    merger.unmerge()


def test_the_staged_weights_are_packed_before_the_commit(demo_assets: DemoAssets) -> None:
    """With the "packed" kernel each staged weight gets its packed copy while staged, and the
    originals keep theirs, so neither the commit nor the unmerge packs anything."""
    if not packed_available():
        pytest.skip("this torch cannot pack weights")
    base_dir = demo_assets.base_model_dir
    weights = load_weights(base_dir, demo_assets.adapter("acme", "billing", "r1").path,
                           torch.float32)  # fmt: skip
    model = load_checkpoint(base_dir, linear_kernel="packed")
    packed = model._linear
    assert isinstance(packed, PackedLinear)
    merger = WeightMerger(model)
    staging = merger.stage(weights)
    staging.advance(float("inf"))
    made = model.prepack
    model.prepack = lambda: pytest.fail("a swap packed")  # type: ignore[method-assign]
    merger.commit(staging)
    targets = [linear_of(model, m.layer, m.module).weight for m in weights.modules]
    assert all(packed.is_current(weight) for weight in targets)
    merger.unmerge()
    targets = [linear_of(model, m.layer, m.module).weight for m in weights.modules]
    assert all(packed.is_current(weight) for weight in targets)
    model.prepack = made  # type: ignore[method-assign]


def test_an_in_place_merger_has_no_staging(demo_assets: DemoAssets) -> None:
    """Off the CPU (or asked so) a merge writes the weights in place: no stage()."""
    base_dir = demo_assets.base_model_dir
    weights = load_weights(base_dir, demo_assets.adapters[0].path, torch.float32)
    merger = WeightMerger(load_checkpoint(base_dir), staged=False)
    with pytest.raises(MergeStateError, match="merges in place"):
        merger.stage(weights)
    assert WeightMerger(load_checkpoint(base_dir)).staged  # a CPU model stages
