"""A staging's arena (model/staged_merge.py, model/buffers.py): on the CPU every merged weight
of one staging is a tensor of its own on one 2 MiB-aligned mapping, mapped at the first
``advance`` (not at ``stage``); the merged weights equal the in-place merge's bit for bit; each
keeps its own version counter (so packed copies stay current); and the mapping is freed when
the staged weights are dropped (abandon, unmerge), whatever holds the staging object."""

from __future__ import annotations

import gc
import itertools
import mmap
import weakref
from pathlib import Path

import pytest
import torch
from tiny_models import vm_flags

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.validate import validate_adapter_dir
from loraplex.demo.assets import DemoAssets
from loraplex.model.adapter_weights import AdapterWeights, load_adapter_weights
from loraplex.model.buffers import HUGE_PAGE_BYTES, arena_mapping, arena_tensor
from loraplex.model.checkpoint import load_checkpoint
from loraplex.model.llama import LlamaModel
from loraplex.model.merge import WeightMerger, linear_of
from loraplex.model.staged_merge import ARENA_ALIGN_BYTES, MergeStaging


def load_weights(base_dir: Path, path: Path, dtype: torch.dtype) -> AdapterWeights:
    spec = BaseModelSpec.from_dir(base_dir)
    return load_adapter_weights(validate_adapter_dir(path, spec, 64), dtype=dtype)


def address(mapping: mmap.mmap) -> int:
    return torch.frombuffer(mapping, dtype=torch.uint8, count=1).data_ptr()


def arena_ref(staging: MergeStaging) -> weakref.ref[mmap.mmap]:
    assert staging._arena is not None
    return weakref.ref(staging._arena[0])


def freed(ref: weakref.ref[mmap.mmap]) -> bool:
    gc.collect()
    return ref() is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_merged_weight_is_its_own_tensor_on_one_aligned_mapping(
    demo_assets: DemoAssets, dtype: torch.dtype
) -> None:
    base_dir = demo_assets.base_model_dir
    weights = load_weights(base_dir, demo_assets.adapter("globex", "summarize", "r1").path, dtype)
    model = load_checkpoint(base_dir, dtype=dtype)
    in_place = load_checkpoint(base_dir, dtype=dtype)
    WeightMerger(in_place, staged=False).merge(weights)
    merger = WeightMerger(model)
    staging = merger.stage(weights)
    assert staging._arena is None  # nothing mapped before the first advance
    staging.advance(0.0)
    assert staging._arena is not None
    mapping, offsets = staging._arena
    start = address(mapping)
    assert (start + offsets[0]) % HUGE_PAGE_BYTES == 0
    staging.advance(float("inf"))
    spans = []
    for module, staged, offset in zip(weights.modules, staging._staged, offsets, strict=True):
        assert staged.merged.data_ptr() == start + offset  # on the arena, where laid out
        assert offset % ARENA_ALIGN_BYTES == 0
        want = linear_of(in_place, module.layer, module.module).weight
        assert torch.equal(staged.merged, want), (module.layer, module.module)  # bit for bit
        spans.append((offset, offset + staged.merged.nbytes))
    spans.sort()
    assert all(end <= nxt for (_, end), (nxt, _) in itertools.pairwise(spans))
    assert spans[-1][1] <= len(mapping)
    # tensors of their own, not views of one: a write to one leaves the others' versions
    versions = [staged.merged._version for staged in staging._staged]
    with torch.no_grad():
        staging._staged[-1].merged.add_(0)
    assert [staged.merged._version for staged in staging._staged[:-1]] == versions[:-1]
    merger.commit(staging)
    merger.unmerge()


def test_writing_one_arena_tensor_leaves_the_others_versions() -> None:
    """A view would share its base's version counter: a write to the next module's weight would
    make the earlier ones' packed copies stale (``PackedLinear`` compares the version)."""
    mapping, start = arena_mapping(3 * ARENA_ALIGN_BYTES, huge_pages=False)
    first = arena_tensor(mapping, start, (4, 8), torch.float32)
    second = arena_tensor(mapping, start + ARENA_ALIGN_BYTES, (4, 8), torch.float32)
    version = first._version
    second.fill_(2.0)
    assert first._version == version
    assert torch.equal(first, torch.zeros(4, 8))  # lazily zeroed, and untouched by the write
    assert second.data_ptr() - first.data_ptr() == ARENA_ALIGN_BYTES


def test_an_abandoned_staging_frees_its_arena(demo_assets: DemoAssets) -> None:
    base_dir = demo_assets.base_model_dir
    weights = load_weights(base_dir, demo_assets.adapters[0].path, torch.float32)
    model = load_checkpoint(base_dir)
    staging = WeightMerger(model).stage(weights)
    staging.advance(0.0)
    staging.advance(0.0)
    ref = arena_ref(staging)
    assert not freed(ref)  # the staged weights hold it
    merger = staging._releases
    assert merger is not None
    staging.abandon()
    assert staging._arena is None and merger.pending_bytes > 0  # freed by pieces, not here
    assert merger.drain() > 0
    assert freed(ref)  # the staging object is still alive: it holds nothing


def test_the_unmerge_frees_the_arena_the_commit_handed_over(demo_assets: DemoAssets) -> None:
    base_dir = demo_assets.base_model_dir
    weights = load_weights(base_dir, demo_assets.adapters[0].path, torch.float32)
    model = load_checkpoint(base_dir)
    merger = WeightMerger(model)
    for _ in range(2):  # a second merge maps an arena of its own, freed the same way
        staging = merger.stage(weights)
        staging.advance(float("inf"))
        ref = arena_ref(staging)
        merger.commit(staging)
        assert staging._arena is None and staging.num_staged == len(weights.modules)
        assert not freed(ref)  # the live (merged) weights are on it
        merger.unmerge()
        assert freed(ref)  # though ``staging`` still exists


def test_the_arena_is_advised_huge_pages_once_every_page_is_written(
    demo_assets: DemoAssets,
) -> None:
    # written on small pages (their first write is the boundaries' cost), then advised, so
    # khugepaged may collapse them off the step boundaries
    base_dir = demo_assets.base_model_dir
    weights = load_weights(base_dir, demo_assets.adapters[0].path, torch.float32)
    model = load_checkpoint(base_dir)
    staging = WeightMerger(model).stage(weights)
    staging.advance(float("inf"))
    first = staging._staged[0].merged
    assert "hg" not in vm_flags(first)
    staged = staging.result()
    assert "hg" in vm_flags(first) and "sh" not in vm_flags(first)
    assert staged.modules[0].merged is first


def staged_whole(
    demo_assets: DemoAssets,
) -> tuple[AdapterWeights, LlamaModel, WeightMerger, MergeStaging]:
    """A float32 demo model, its merger and a staging of the first demo adapter, all staged."""
    base_dir = demo_assets.base_model_dir
    weights = load_weights(base_dir, demo_assets.adapters[0].path, torch.float32)
    model = load_checkpoint(base_dir)
    merger = WeightMerger(model)
    staging = merger.stage(weights)
    staging.advance(float("inf"))
    return weights, model, merger, staging


def test_an_engine_unmerge_leaves_the_arena_to_be_freed_by_pieces(
    demo_assets: DemoAssets,
) -> None:
    """``unmerge(release_now=False)`` (the engine's) frees nothing: freed at once inside the slot
    lock, the large preset's arena held the steps 23-37 ms (1.2-1.4 ms on buffers of their own);
    ``releases.step`` then frees it at most its budget at a time, unmapped after the last."""
    _weights, _model, merger, staging = staged_whole(demo_assets)
    ref = arena_ref(staging)
    size = len(staging._arena[0])  # type: ignore[index]
    merger.commit(staging)
    merger.unmerge(release_now=False)
    assert not freed(ref) and merger.releases.pending_bytes == size
    budget = 16 * mmap.PAGESIZE
    pieces = []
    while merger.releases.pending_bytes:
        pieces.append(merger.releases.step(budget))
    assert all(piece <= budget for piece in pieces) and sum(pieces) == size
    assert freed(ref)


def test_a_merged_weight_still_held_keeps_its_arena_whole(demo_assets: DemoAssets) -> None:
    """Nothing is freed under a tensor that still reads the arena (a reference kept anywhere):
    the release waits until the last one goes."""
    weights, model, merger, staging = staged_whole(demo_assets)
    merger.commit(staging)
    kept = linear_of(model, weights.modules[-1].layer, weights.modules[-1].module).weight
    copy = kept.detach().clone()
    merger.unmerge()  # release_now: freed at once, but for the weight still held
    assert merger.releases.pending_bytes > 0
    assert merger.releases.drain() == 0 and merger.releases.step(1 << 30) == 0
    assert torch.equal(kept, copy)  # not zeroed under it
    del kept
    gc.collect()
    assert merger.releases.drain() > 0 and merger.releases.pending_bytes == 0
