"""Mixed-adapter batches: each sequence's logits equal PEFT's for its adapter alone (or the base
model), and greedy continuations are identical, across popularity patterns and rank mixes."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import hf_model, rel_error, save_tiny_model, save_word_tokenizer

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.validate import validate_adapter_dir
from loraplex.engine.offline import OfflineConfig, OfflineEngine, OfflineRequest
from loraplex.model.adapter_weights import load_adapter_weights
from loraplex.model.checkpoint import load_checkpoint
from loraplex.model.kv_cache import ContiguousKVCache, SequenceChunk
from loraplex.model.llama import ForwardBatch, LlamaModel
from loraplex.model.lora import LoraSlotPool
from loraplex.sampling import SamplingParams

RANK_MIXES = {"all-8": (8,), "S2": (64, 32, 16, 8), "all-64": (64,)}
POPULARITY = ("identical", "distinct", "uniform", "zipf", "geometric")
NUM_ADAPTERS = 6
PROMPT_LENGTHS = (3, 9, 5, 10, 4, 7, 6, 8)
NONE_AT = (2, 6)  # sequences that use no adapter in every batch
NEW_TOKENS = 6
ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
ALL = [*ATTN, "gate_proj", "up_proj", "down_proj"]


def adapter_config(index: int, rank: int) -> dict[str, Any]:
    """Varied PEFT configs: targets, alpha != r, rsLoRA, rank/alpha patterns, layer subsets."""
    variants: list[dict[str, Any]] = [
        {"target_modules": ATTN, "lora_alpha": 2 * rank},
        {"target_modules": ALL, "lora_alpha": rank // 2 + 3, "use_rslora": True},
        {
            "target_modules": ["v_proj", "down_proj"],
            "lora_alpha": rank + 1,
            "rank_pattern": {"down_proj": max(rank // 2, 1)},
            "alpha_pattern": {"down_proj": 5},
        },
        {"target_modules": ["q_proj", "gate_proj", "up_proj"], "lora_alpha": 7,
         "layers_to_transform": [1]},
    ]  # fmt: skip
    return {"r": rank, **variants[index % len(variants)]}


@dataclass
class MixSetup:
    """One rank mix: adapters on disk, our pool holding them, PEFT holding them."""

    model: LlamaModel
    pool: LoraSlotPool
    peft: Any
    reference: dict[tuple[int | None, int], tuple[torch.Tensor, list[int]]]  # PEFT, memoised
    dirs: list[Path]  # adapter directories, by slot


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = save_tiny_model(tmp_path_factory.mktemp("lora") / "tiny-base", "llama")
    save_word_tokenizer(base)  # the engine loads one; prompts here are token ids
    return base


@pytest.fixture(scope="module")
def engine(base_dir: Path) -> Iterator[OfflineEngine]:
    """The serving engine, offline, with a slot for every adapter of a mix."""
    with OfflineEngine(base_dir, OfflineConfig(max_loras=NUM_ADAPTERS)) as offline:
        yield offline


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(123)
    return [torch.randint(3, 97, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


def make_adapters(base_dir: Path, out: Path, ranks: tuple[int, ...]) -> list[Path]:
    from peft import LoraConfig, get_peft_model

    dirs = []
    for i in range(NUM_ADAPTERS):
        torch.manual_seed(100 + i)
        config = LoraConfig(init_lora_weights=False, **adapter_config(i, ranks[i % len(ranks)]))
        peft_model = get_peft_model(hf_model(base_dir), config)
        with torch.no_grad():  # B ~ N(0, 0.02) by default: make each adapter clearly visible
            for name, param in peft_model.named_parameters():
                if "lora_B" in name:
                    param.mul_(20.0 / ranks[i % len(ranks)] ** 0.5)
        peft_model.save_pretrained(out / f"a{i}")
        dirs.append(out / f"a{i}")
    return dirs


def peft_reference(
    peft: Any, slot: int | None, prompt: list[int], new_tokens: int = NEW_TOKENS
) -> tuple[torch.Tensor, list[int]]:
    """PEFT's logits for ``prompt`` with one adapter (or none) active, and its greedy tokens."""
    if slot is None:
        with peft.disable_adapter():
            return peft_reference_active(peft, prompt, new_tokens)
    peft.set_adapter(f"a{slot}")
    return peft_reference_active(peft, prompt, new_tokens)


def peft_reference_active(
    peft: Any, prompt: list[int], new_tokens: int
) -> tuple[torch.Tensor, list[int]]:
    ids = list(prompt)
    with torch.no_grad():
        logits = peft(torch.tensor([ids])).logits[0]
        for _ in range(new_tokens):
            ids.append(int(peft(torch.tensor([ids])).logits[0, -1].argmax()))
    return logits, ids[len(prompt) :]


@pytest.fixture(scope="module")
def mixes(
    base_dir: Path, prompts: list[list[int]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, MixSetup]:
    from peft import PeftModel

    spec = BaseModelSpec.from_dir(base_dir)
    model = load_checkpoint(base_dir)
    setups = {}
    for mix, ranks in RANK_MIXES.items():
        dirs = make_adapters(base_dir, tmp_path_factory.mktemp(mix), ranks)
        pool = LoraSlotPool(spec, NUM_ADAPTERS, 64, dtype=torch.float32, device=model.device)
        peft = PeftModel.from_pretrained(hf_model(base_dir), dirs[0], adapter_name="a0")
        for slot, adapter_dir in enumerate(dirs):
            validated = validate_adapter_dir(adapter_dir, spec, 64)
            pool.load(slot, load_adapter_weights(validated, dtype=torch.float32))
            if slot:
                peft.load_adapter(adapter_dir, adapter_name=f"a{slot}")
        setups[mix] = MixSetup(model, pool, peft.eval(), {}, dirs)
    return setups


def assign_slots(pattern: str, seed: int = 0) -> list[int | None]:
    rng = random.Random(seed)
    weights = {
        "uniform": [1.0] * NUM_ADAPTERS,
        "zipf": [1 / (i + 1) for i in range(NUM_ADAPTERS)],
        "geometric": [1.5**-i for i in range(NUM_ADAPTERS)],
    }
    slots: list[int | None] = []
    for i in range(len(PROMPT_LENGTHS)):
        if i in NONE_AT:
            slots.append(None)
        elif pattern == "identical":
            slots.append(1)
        elif pattern == "distinct":
            slots.append(sum(s is not None for s in slots))
        else:
            slots.append(rng.choices(range(NUM_ADAPTERS), weights[pattern])[0])
    return slots


def mixed_logits(
    setup: MixSetup, prompts: list[list[int]], slots: list[int | None]
) -> torch.Tensor:
    model = setup.model
    kv = ContiguousKVCache(model.attention_shape, len(prompts), 16, dtype=model.dtype,
                           device=model.device)  # fmt: skip
    chunks = [SequenceChunk(kv.allocate(), 0, len(p)) for p in prompts]
    token_slots = [-1 if s is None else s for s, p in zip(slots, prompts, strict=True) for _ in p]
    flat = [t for p in prompts for t in p]
    batch = ForwardBatch.build(flat, chunks, token_slots=token_slots, all_logits=True)
    return model.forward_batch(batch, kv, setup.pool)


@pytest.mark.parametrize("mix", sorted(RANK_MIXES))
@pytest.mark.parametrize("pattern", POPULARITY)
def test_mixed_batch_equals_peft_alone(
    mix: str,
    pattern: str,
    mixes: dict[str, MixSetup],
    prompts: list[list[int]],
    engine: OfflineEngine,
) -> None:
    setup = mixes[mix]
    slots = assign_slots(pattern)
    assert any(s is None for s in slots) and any(s is not None for s in slots)
    logits = mixed_logits(setup, prompts, slots)
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    requests = [
        OfflineRequest(tuple(p), None if s is None else setup.dirs[s], params)
        for p, s in zip(prompts, slots, strict=True)
    ]
    outputs = engine.generate(requests)
    offset = 0
    for prompt, slot, output in zip(prompts, slots, outputs, strict=True):
        key = (slot, len(prompt))
        if key not in setup.reference:
            setup.reference[key] = peft_reference(setup.peft, slot, prompt)
        want_logits, want_tokens = setup.reference[key]
        got = logits[offset : offset + len(prompt)]
        assert rel_error(got, want_logits) < 1e-4, (slot, len(prompt))
        assert list(output.token_ids) == want_tokens, (slot, len(prompt))
        offset += len(prompt)


def test_adapters_change_the_output(mixes: dict[str, MixSetup], prompts: list[list[int]]) -> None:
    """Guards the comparison above: every adapter moves the logits away from the base's."""
    setup = mixes["S2"]
    base = mixed_logits(setup, prompts[:1] * NUM_ADAPTERS, [None] * NUM_ADAPTERS)
    adapted = mixed_logits(setup, prompts[:1] * NUM_ADAPTERS, list(range(NUM_ADAPTERS)))
    per_adapter = (adapted - base).abs().reshape(NUM_ADAPTERS, -1).amax(-1)
    assert bool((per_adapter > 1e-2 * base.abs().max()).all())


def test_bfloat16_mixed_batch_tracks_float32(
    base_dir: Path, prompts: list[list[int]], mixes: dict[str, MixSetup]
) -> None:
    fp32 = mixes["S2"]
    spec = BaseModelSpec.from_dir(base_dir)
    model = load_checkpoint(base_dir, dtype=torch.bfloat16)
    pool = LoraSlotPool(spec, NUM_ADAPTERS, 64, dtype=torch.bfloat16, device=model.device)
    for slot, adapter_dir in enumerate(fp32.dirs):
        validated = validate_adapter_dir(adapter_dir, spec, 64)
        pool.load(slot, load_adapter_weights(validated, dtype=torch.bfloat16))
    slots = assign_slots("distinct")
    bf16 = mixed_logits(MixSetup(model, pool, None, {}, fp32.dirs), prompts, slots)
    assert bf16.dtype == torch.bfloat16
    want = mixed_logits(fp32, prompts, slots)
    # The yardstick is PEFT itself in bfloat16: our rounding error may not exceed its own by much.
    peft_bf16 = fp32.peft.to(torch.bfloat16)
    try:
        offset, peft_error = 0, 0.0
        for prompt, slot in zip(prompts, slots, strict=True):
            theirs, _ = peft_reference(peft_bf16, slot, prompt, new_tokens=0)
            span = want[offset : offset + len(prompt)]
            peft_error = max(peft_error, rel_error(theirs, span))
            offset += len(prompt)
    finally:
        fp32.peft.to(torch.float32)
    ours_error = rel_error(bf16, want)
    assert ours_error < max(2 * peft_error, 1e-2)
