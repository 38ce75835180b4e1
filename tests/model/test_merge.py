"""Merged execution: a merged adapter's logits equal PEFT's (and PEFT's merge_and_unload), other
adapters and the base model are untouched in the same batch, and unmerging restores the base
weights bit for bit. Demo adapter shapes (ranks 4-64, rsLoRA, partial targets, patterns,
layers_to_transform) plus a rank-128 adapter, in float32 and bfloat16."""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import rel_error

from loraplex.artifacts.base_model import TARGET_MODULES, BaseModelSpec
from loraplex.artifacts.validate import validate_adapter_dir
from loraplex.demo.assets import DemoAssets
from loraplex.model.adapter_weights import AdapterWeights, load_adapter_weights
from loraplex.model.checkpoint import load_checkpoint
from loraplex.model.kv_cache import ContiguousKVCache, SequenceChunk
from loraplex.model.layers import PackedLinear, packed_available
from loraplex.model.llama import ForwardBatch, LlamaModel, LoraApplier, layer_linears
from loraplex.model.lora import LoraSlotPool
from loraplex.model.merge import (
    MAX_DELTA_RATIO,
    MergedLoraApplier,
    MergeRefusedError,
    MergeStateError,
    WeightMerger,
    linear_of,
    negated,
    negative_pool_for,
    slot_weights,
)
from loraplex.ops import get_backend
from loraplex.ops.merged_op import FusedMergedBatch

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

# One demo revision per shape the catalogue has, plus "rank128" (generated here: only the large
# preset has a rank-128 adapter).
SHAPES = {
    "attn-r8": "acme/support@r1",
    "all-r16": "acme/billing@r1",
    "sparse-r4": "acme/legal@r1",
    "rslora-qv-r32": "acme/triage@r1",
    "all-r64": "globex/summarize@r1",
    "patterns": "globex/translate@r1",
    "layers-1-2": "globex/codegen@r1",
    "mlp-r32": "initech/extract@r1",
    "rank128": "",
}
MAX_RANK = 128
PROMPTS = ([5, 17, 42, 8, 99, 3, 61], [7, 7, 300, 12], [1, 2, 3, 4, 5, 6, 7, 8, 9])


@pytest.fixture(scope="module")
def rank128_dir(demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = transformers.AutoModelForCausalLM.from_pretrained(demo_assets.base_model_dir)
    torch.manual_seed(11)
    config = peft.LoraConfig(
        r=128, lora_alpha=256, target_modules=list(TARGET_MODULES), init_lora_weights=False
    )
    model = peft.get_peft_model(base, config)
    with torch.no_grad():  # random init at rank 128 would swamp the base model: scale it down
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.mul_(0.05)
    out = tmp_path_factory.mktemp("merge") / "rank128"
    model.save_pretrained(out)
    return out


def adapter_dir(demo_assets: DemoAssets, shape: str, rank128_dir: Path) -> Path:
    if not SHAPES[shape]:
        return rank128_dir
    tenant_name, revision = SHAPES[shape].split("@")
    tenant, name = tenant_name.split("/")
    return demo_assets.adapter(tenant, name, revision).path


def load_weights(base_dir: Path, path: Path, dtype: torch.dtype) -> AdapterWeights:
    spec = BaseModelSpec.from_dir(base_dir)
    return load_adapter_weights(validate_adapter_dir(path, spec, MAX_RANK), dtype=dtype)


def prompt_slots(slots: list[int | None]) -> torch.Tensor:
    """The token slots of :func:`run`'s batch: ``slots`` per prompt, -1 for None."""
    return torch.tensor(
        [-1 if s is None else s for s, p in zip(slots, PROMPTS, strict=True) for _ in p]
    )


def run(model: LlamaModel, slots: list[int | None], lora: LoraApplier | None) -> torch.Tensor:
    """Logits at every position of every prompt, in one batch; ``slots`` per prompt."""
    total = sum(len(p) for p in PROMPTS)
    kv = ContiguousKVCache(
        model.attention_shape, len(PROMPTS), total, dtype=model.dtype, device=model.device
    )
    chunks = [SequenceChunk(kv.allocate(), 0, len(p)) for p in PROMPTS]
    ids = [t for p in PROMPTS for t in p]
    batch = ForwardBatch.build(
        ids, chunks, token_slots=prompt_slots(slots).tolist(), all_logits=True
    )
    return model.forward_batch(batch, kv, lora).float()


@cache  # HF/PEFT models are slow to build; each reference is computed once
def peft_logits(base_dir: Path, path: Path | None, *, merge: bool = False) -> torch.Tensor:
    """transformers (+ PEFT) float32 logits of each prompt alone, concatenated."""
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(
        base_dir, attn_implementation="eager"
    )
    if path is not None:
        model = peft.PeftModel.from_pretrained(model, path)
        if merge:
            model = model.merge_and_unload()
    with torch.no_grad():
        return torch.cat([model.eval()(torch.tensor([p])).logits[0] for p in PROMPTS])


def merged_setup(
    base_dir: Path, weights: AdapterWeights, other: AdapterWeights, dtype: torch.dtype
) -> tuple[LlamaModel, LoraSlotPool, WeightMerger, MergedLoraApplier]:
    """Slot 0: another adapter; slot 1: the merged one, read back from the pool to merge."""
    model = load_checkpoint(base_dir, dtype=dtype)
    pool = LoraSlotPool(
        BaseModelSpec.from_dir(base_dir), 2, MAX_RANK, dtype=dtype, device=torch.device("cpu")
    )
    pool.load(0, other)
    pool.load(1, weights)
    from_slot = slot_weights(pool, 1)
    negative = negative_pool_for(pool)
    negative.load(0, negated(from_slot))
    merger = WeightMerger(model)
    merger.merge(from_slot)
    return model, pool, merger, MergedLoraApplier(pool, 1, negative)


def two_pass_applier(
    base_dir: Path, weights: AdapterWeights, other: AdapterWeights
) -> MergedLoraApplier:
    """Like :func:`merged_setup`'s applier (slot 0 ``other``, slot 1 ``weights`` merged) on the
    ``reference`` backend, which subtracts in a second pass of its own (float32)."""
    pool = LoraSlotPool(
        BaseModelSpec.from_dir(base_dir),
        2,
        MAX_RANK,
        dtype=torch.float32,
        device=torch.device("cpu"),
        backend="reference",
    )
    pool.load(0, other)
    pool.load(1, weights)
    negative = negative_pool_for(pool)
    negative.load(0, negated(slot_weights(pool, 1)))
    return MergedLoraApplier(pool, 1, negative)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_merged_float32_equals_peft_and_merge_and_unload(
    demo_assets: DemoAssets, rank128_dir: Path, shape: str
) -> None:
    base_dir = demo_assets.base_model_dir
    path = adapter_dir(demo_assets, shape, rank128_dir)
    weights = load_weights(base_dir, path, torch.float32)
    other = load_weights(base_dir, demo_assets.adapters[0].path, torch.float32)
    model, pool, merger, applier = merged_setup(base_dir, weights, other, torch.float32)
    assert merger.merged_digest == weights.digest
    merged_rows = run(model, [1, 1, 1], applier)
    want = peft_logits(base_dir, path)
    assert rel_error(merged_rows, want) < 1e-4
    assert rel_error(merged_rows, peft_logits(base_dir, path, merge=True)) < 1e-4
    # Mixed while merged: the base model and another adapter get exactly their own outputs.
    mixed = run(model, [None, 1, 0], applier)
    n0, n1 = len(PROMPTS[0]), len(PROMPTS[0]) + len(PROMPTS[1])
    base_want = peft_logits(base_dir, None)
    other_want = peft_logits(base_dir, demo_assets.adapters[0].path)
    assert rel_error(mixed[:n0], base_want[:n0]) < 1e-4
    assert rel_error(mixed[n0:n1], want[n0:n1]) < 1e-4
    assert rel_error(mixed[n1:], other_want[n1:]) < 1e-4
    pool.check_integrity()


def test_unmerge_restores_every_weight_bit_for_bit(demo_assets: DemoAssets) -> None:
    base_dir = demo_assets.base_model_dir
    weights = load_weights(base_dir, demo_assets.adapter("globex", "summarize", "r1").path,
                           torch.bfloat16)  # fmt: skip
    model = load_checkpoint(base_dir, dtype=torch.bfloat16)
    before = {name: p.clone() for name, p in model.named_parameters()}
    merger = WeightMerger(model)
    for _ in range(3):  # repeated cycles do not drift
        merger.merge(weights)
        changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
        assert changed and all(".mlp." in n or ".self_attn." in n for n in changed)
        merger.unmerge()
        assert merger.merged_digest is None
        for name, param in model.named_parameters():
            assert torch.equal(param, before[name]), name


def test_merge_and_unmerge_repack_the_weights_they_write(demo_assets: DemoAssets) -> None:
    """float32 on a CPU runs oneDNN on packed copies of the weights: a merge and an unmerge
    repack what they wrote at once (so the next step pays no repack), and the logits follow
    the weights as written (the same as a model loaded with oneDNN on the dense weights)."""
    if not packed_available():
        pytest.skip("this torch cannot pack weights")
    base_dir = demo_assets.base_model_dir
    weights = load_weights(base_dir, demo_assets.adapter("globex", "summarize", "r1").path,
                           torch.float32)  # fmt: skip
    model = load_checkpoint(base_dir, linear_kernel="packed")
    dense = load_checkpoint(base_dir, linear_kernel="onednn")
    packed = model._linear
    assert isinstance(packed, PackedLinear)
    linears = [m.weight for layer in model.model.layers for m in layer_linears(layer)]
    merger, dense_merger = WeightMerger(model), WeightMerger(dense)
    for _ in range(2):
        merger.merge(weights)
        dense_merger.merge(weights)
        assert all(packed.is_current(weight) for weight in linears)
        assert torch.equal(run(model, [None] * 3, None), run(dense, [None] * 3, None))
        merger.unmerge()
        dense_merger.unmerge()
        assert all(packed.is_current(weight) for weight in linears)
        assert torch.equal(run(model, [None] * 3, None), run(dense, [None] * 3, None))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_delta_swamping_the_base_weights_is_refused_and_changes_nothing(
    demo_assets: DemoAssets, dtype: torch.dtype
) -> None:
    """Merged, ``round(W + sBA) x - sBA x`` loses W under a huge finite delta (attack23: other
    tenants' greedy tokens flipped): such a merge is refused by name, and the modules written
    before the one refused (here only the last module is huge) are restored bit for bit."""
    base_dir = demo_assets.base_model_dir
    weights = load_weights(base_dir, demo_assets.adapter("acme", "billing", "r1").path, dtype)
    *kept, last = weights.modules
    huge = dataclasses.replace(last, scale=last.scale * MAX_DELTA_RATIO * 1e3)
    poisoned = AdapterWeights(weights.digest, weights.dtype, (*kept, huge))
    model = load_checkpoint(base_dir, dtype=dtype)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    merger = WeightMerger(model)
    with pytest.raises(MergeRefusedError, match=rf"layer {last.layer} {last.module} .* times"):
        merger.merge(poisoned)
    assert merger.merged_digest is None
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    merger.merge(weights)  # the adapter itself merges (and unmerges) as before
    merger.unmerge()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_loose_bound_is_multiplied_out_not_refused(demo_assets: DemoAssets) -> None:
    """The refusal checks a bound from the factors first; factors whose bound is huge but whose
    product is zero (B's rows and A's columns on different rank rows) still merge."""
    base_dir = demo_assets.base_model_dir
    weights = load_weights(base_dir, demo_assets.adapter("acme", "billing", "r1").path,
                           torch.float32)  # fmt: skip
    first, *rest = weights.modules
    lora_a, lora_b = torch.zeros_like(first.lora_a), torch.zeros_like(first.lora_b)
    lora_a[1, :], lora_b[:, 0] = 1e3, 1e3  # B @ A = 0; the bound is 1e6 times the scale
    zero = dataclasses.replace(first, lora_a=lora_a, lora_b=lora_b)
    model = load_checkpoint(base_dir)
    before = linear_of(model, first.layer, first.module).weight.clone()
    merger = WeightMerger(model)
    merger.merge(AdapterWeights(weights.digest, weights.dtype, (zero, *rest)))
    assert torch.equal(linear_of(model, first.layer, first.module).weight, before)
    merger.unmerge()


def test_merge_twice_or_unmerge_unmerged_is_refused(demo_assets: DemoAssets) -> None:
    base_dir = demo_assets.base_model_dir
    weights = load_weights(base_dir, demo_assets.adapters[0].path, torch.float32)
    merger = WeightMerger(load_checkpoint(base_dir))
    with pytest.raises(MergeStateError, match="nothing is merged"):
        merger.unmerge()
    merger.merge(weights)
    assert merger.merged_digest == weights.digest
    with pytest.raises(MergeStateError, match="expected an unmerge first"):
        merger.merge(weights)


def test_empty_slots_cannot_be_merged(demo_assets: DemoAssets) -> None:
    pool = LoraSlotPool(BaseModelSpec.from_dir(demo_assets.base_model_dir), 2, 8,
                        dtype=torch.float32, device=torch.device("cpu"))  # fmt: skip
    with pytest.raises(MergeStateError, match="slot 1 holds no adapter"):
        slot_weights(pool, 1)
    with pytest.raises(MergeStateError, match="negative pool slot 0 is empty"):
        MergedLoraApplier(pool, 1, negative_pool_for(pool))


@pytest.mark.parametrize("shape", ["all-r64", "rslora-qv-r32", "layers-1-2", "rank128"])
def test_merged_bfloat16_is_as_close_to_float32_peft_as_unmerged_bfloat16(
    demo_assets: DemoAssets, rank128_dir: Path, shape: str
) -> None:
    """bfloat16 keeps 8 significant bits: the unmerged bf16 path itself is ~1e-2 off the float32
    reference. Merging adds one rounding of ``W + s*B*A`` to bf16 per weight, the same order as
    the rounding every bf16 weight already has, so merged must stay within twice the unmerged
    error (with a 1e-2 floor for lucky small unmerged errors); a wrong merge is off by far more."""
    base_dir = demo_assets.base_model_dir
    path = adapter_dir(demo_assets, shape, rank128_dir)
    weights = load_weights(base_dir, path, torch.bfloat16)
    other = load_weights(base_dir, demo_assets.adapters[0].path, torch.bfloat16)
    want = peft_logits(base_dir, path)
    base_want = peft_logits(base_dir, None)
    model, pool, merger, applier = merged_setup(base_dir, weights, other, torch.bfloat16)
    merged_rows = run(model, [1, None, 1], applier)
    merger.unmerge()
    unmerged_rows = run(model, [1, None, 1], pool)
    n0, n1 = len(PROMPTS[0]), len(PROMPTS[0]) + len(PROMPTS[1])
    for rows, reference in ((slice(0, n0), want), (slice(n0, n1), base_want)):
        bound = max(2 * rel_error(unmerged_rows[rows], reference[rows]), 1e-2)
        assert rel_error(merged_rows[rows], reference[rows]) <= bound
    assert merged_rows[:n0].argmax(-1).tolist() == unmerged_rows[:n0].argmax(-1).tolist()


@pytest.mark.parametrize("shape", ["all-r64", "rslora-qv-r32", "rank128"])
def test_other_revisions_in_float32_beside_a_bfloat16_merge_stay_near_float32_peft(
    demo_assets: DemoAssets, rank128_dir: Path, shape: str
) -> None:
    """The merged step's float32 pass (bfloat16 weights on a CPU, few foreign tokens): another
    adapter's and the base model's rows, beside the merged revision, stay within the merge
    test's standard (twice the unmerged bfloat16 error against float32 PEFT), with the same
    greedy tokens as unmerged; the merged revision's rows are those of the dtype's pass."""
    base_dir = demo_assets.base_model_dir
    path = adapter_dir(demo_assets, shape, rank128_dir)
    other_path = demo_assets.adapters[0].path
    weights = load_weights(base_dir, path, torch.bfloat16)
    other = load_weights(base_dir, other_path, torch.bfloat16)
    model, pool, merger, applier = merged_setup(base_dir, weights, other, torch.bfloat16)
    half = MergedLoraApplier(pool, 1, applier.negative, float32_max_tokens=0)
    slots: list[int | None] = [1, 0, None]  # 13 foreign tokens: at most FLOAT32_MAX_TOKENS
    plan = applier.prepare(prompt_slots(slots))
    assert isinstance(plan, FusedMergedBatch) and plan.float32
    merged_rows, half_rows = run(model, slots, applier), run(model, slots, half)
    merger.unmerge()
    unmerged_rows = run(model, slots, pool)
    n0, n1 = len(PROMPTS[0]), len(PROMPTS[0]) + len(PROMPTS[1])
    wants = ((slice(n0, n1), peft_logits(base_dir, other_path)), (slice(n1, None), None))
    for rows, reference in wants:
        want = (reference if reference is not None else peft_logits(base_dir, None))[rows]
        bound = max(2 * rel_error(unmerged_rows[rows], want), 1e-2)
        assert rel_error(merged_rows[rows], want) <= bound
        assert merged_rows[rows].argmax(-1).tolist() == unmerged_rows[rows].argmax(-1).tolist()
    assert torch.equal(merged_rows[:n0], half_rows[:n0])  # merged rows: no LoRA work either way
    assert not torch.equal(merged_rows[n0:], half_rows[n0:])  # the float32 pass ran


@pytest.mark.parametrize("shape", ["sparse-r4", "layers-1-2", "mlp-r32"])
def test_fused_negative_pass_equals_the_two_pass_subtraction(
    demo_assets: DemoAssets, rank128_dir: Path, shape: str
) -> None:
    """Torch backends fold the negative copy into the masked or grouped pass (grouped: in place
    when each slot's foreign tokens form one run, else one gather and one scatter); any other
    backend (here ``reference``) subtracts in a second pass of its own. All give the same
    logits on a batch mixing the merged revision, another adapter and the base model, with
    modules only one side targets; a batch of the merged revision alone does no LoRA work."""
    base_dir = demo_assets.base_model_dir
    weights = load_weights(base_dir, adapter_dir(demo_assets, shape, rank128_dir), torch.float32)
    other = load_weights(base_dir, demo_assets.adapters[0].path, torch.float32)
    model, pool, _, fused = merged_setup(base_dir, weights, other, torch.float32)
    two_pass = two_pass_applier(base_dir, weights, other)
    assert fused.fused and not two_pass.fused
    # grouped: slot 0's tokens in one run (in place) or split by the merged revision (gathered)
    in_place = {(None, 1, 0): True, (0, None, 1): True, (1, 0, 0): True, (0, 1, 0): False}
    for backend in ("masked", "grouped"):  # the two computations the fused pass can ride
        pool.backend = get_backend(backend)
        for slots, runs_in_place in in_place.items():
            got, want = run(model, list(slots), fused), run(model, list(slots), two_pass)
            assert fused.last_strategy == backend
            assert rel_error(got, want) < 1e-5, (backend, slots)
            plan = fused.prepare(prompt_slots(list(slots)))
            assert isinstance(plan, FusedMergedBatch)
            assert (plan.order is None) == (backend == "grouped" and runs_in_place), slots
    merged_only = run(model, [1, 1, 1], fused)
    assert fused.last_strategy == "none"
    assert rel_error(merged_only, run(model, [1, 1, 1], two_pass)) < 1e-5


class CountingApplier:
    """``inner`` with its per-module ``apply`` calls counted."""

    def __init__(self, inner: LoraApplier) -> None:
        self.inner, self.calls = inner, 0

    def prepare(self, token_slots: torch.Tensor) -> Any:
        return self.inner.prepare(token_slots)

    def apply(self, layer: int, module: str, x: torch.Tensor, out: torch.Tensor, batch: Any) -> Any:
        self.calls += 1
        return self.inner.apply(layer, module, x, out, batch)


def test_a_batch_of_the_merged_revision_alone_makes_no_lora_calls(
    demo_assets: DemoAssets,
) -> None:
    """Every token on the merged revision: the layers run as the base model's, with no
    per-module LoRA call (single-revision merged / base was 0.968, issue 28). A step that
    still needs the negative pass (another backend's two-pass form, base tokens among merged
    ones: its own pass has nothing to do) keeps its calls."""
    base_dir = demo_assets.base_model_dir
    weights = load_weights(base_dir, demo_assets.adapters[1].path, torch.float32)
    other = load_weights(base_dir, demo_assets.adapters[0].path, torch.float32)
    model, _, _, fused = merged_setup(base_dir, weights, other, torch.float32)
    counted = CountingApplier(fused)
    alone = run(model, [1, 1, 1], counted)
    assert counted.calls == 0
    assert torch.equal(alone, run(model, [1, 1, 1], fused))
    two_pass = CountingApplier(two_pass_applier(base_dir, weights, other))
    mixed = run(model, [None, 1, 1], two_pass)
    assert two_pass.calls > 0
    assert rel_error(mixed, run(model, [None, 1, 1], fused)) < 1e-5
