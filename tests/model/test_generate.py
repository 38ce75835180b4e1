"""The offline generation API: mixed batches, seeded sampling, stop strings, EOS, capacity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_models import hf_model, save_tiny_model, save_word_tokenizer

from loraplex.errors import AdapterConfigError, CapacityError
from loraplex.model.generate import (
    GenerationRequest,
    GenerationResult,
    GeneratorConfig,
    OfflineGenerator,
)
from loraplex.sampling import SamplingParams

PROMPTS = ("w5 w17 w3 w40", "w8 w9", "w60 w61 w62 w63 w64 w65", "w11")


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    """A tiny base model with a word tokenizer, and two PEFT adapters for it."""
    from peft import LoraConfig, get_peft_model

    root = tmp_path_factory.mktemp("gen")
    base = save_tiny_model(root / "tiny-gen", "qwen2")
    save_word_tokenizer(base)
    adapters = []
    for i, (rank, targets) in enumerate([(8, ["q_proj", "v_proj"]), (4, ["down_proj", "o_proj"])]):
        torch.manual_seed(i)
        config = LoraConfig(r=rank, lora_alpha=16, target_modules=targets, init_lora_weights=False)
        peft_model = get_peft_model(hf_model(base), config)
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_B" in name:
                    param.mul_(10.0)
        peft_model.save_pretrained(root / f"adapter{i}")
        adapters.append(root / f"adapter{i}")
    return base, adapters


@pytest.fixture(scope="module")
def generator(assets: tuple[Path, list[Path]]) -> OfflineGenerator:
    return OfflineGenerator(assets[0], GeneratorConfig(max_loras=2, max_lora_rank=16))


def mixed_requests(adapters: list[Path], params: SamplingParams) -> list[GenerationRequest]:
    choice = [adapters[0], None, adapters[1], adapters[0]]
    return [GenerationRequest(p, a, params) for p, a in zip(PROMPTS, choice, strict=True)]


def test_mixed_batch_equals_each_request_alone(
    generator: OfflineGenerator, assets: tuple[Path, list[Path]]
) -> None:
    requests = mixed_requests(assets[1], SamplingParams(max_tokens=8, ignore_eos=True))
    together = generator.generate(requests)
    alone = [generator.generate([r])[0] for r in requests]
    assert together == alone
    assert all(r.finish_reason == "length" and len(r.token_ids) == 8 for r in together)
    assert together[0].text == " ".join(f"w{t}" for t in together[0].token_ids)
    assert together[0].prompt_tokens == 5  # BOS + four words


def test_greedy_equals_peft_generate(
    generator: OfflineGenerator, assets: tuple[Path, list[Path]]
) -> None:
    from peft import PeftModel

    base, adapters = assets
    ours = generator.generate([GenerationRequest(PROMPTS[0], adapters[1], SamplingParams(8))])
    peft = PeftModel.from_pretrained(hf_model(base), adapters[1]).eval()
    ids = torch.tensor([generator.tokenizer.encode(PROMPTS[0])])
    with torch.no_grad():
        out = peft.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=None,
                            pad_token_id=0)  # fmt: skip
    assert list(ours[0].token_ids) == out[0, ids.shape[1] :].tolist()


def test_seeded_sampling_is_reproducible_and_batch_independent(
    generator: OfflineGenerator, assets: tuple[Path, list[Path]]
) -> None:
    params = SamplingParams(max_tokens=12, temperature=1.5, top_p=0.95, seed=7, ignore_eos=True)
    requests = mixed_requests(assets[1], params)
    first = generator.generate(requests)
    assert generator.generate(requests) == first
    # The same request alone, or among different neighbours, draws the same tokens.
    assert generator.generate([requests[2]])[0] == first[2]
    neighbours = [GenerationRequest("w90 w91", None, SamplingParams(12, temperature=0.7))]
    assert generator.generate([*neighbours, requests[2]])[1] == first[2]
    reseeded = SamplingParams(max_tokens=12, temperature=1.5, top_p=0.95, seed=8, ignore_eos=True)
    other = generator.generate([GenerationRequest(PROMPTS[2], assets[1][1], reseeded)])
    assert other[0].token_ids != first[2].token_ids
    greedy = generator.generate([GenerationRequest(PROMPTS[2], assets[1][1], SamplingParams(12))])
    assert first[2].token_ids != greedy[0].token_ids


def test_top_k_one_is_greedy(generator: OfflineGenerator) -> None:
    greedy = generator.generate([GenerationRequest(PROMPTS[1], None, SamplingParams(10))])
    sampled = SamplingParams(10, temperature=2.0, top_k=1, seed=3)
    assert generator.generate([GenerationRequest(PROMPTS[1], None, sampled)]) == greedy


def test_stop_string_cuts_text_and_ends_generation(generator: OfflineGenerator) -> None:
    full = generator.generate([GenerationRequest(PROMPTS[0], None, SamplingParams(10))])[0]
    stop_word = f"w{full.token_ids[4]}"
    assert f"w{full.token_ids[0]}" != stop_word  # the cut point is the first occurrence
    first_hit = [f"w{t}" for t in full.token_ids].index(stop_word)
    params = SamplingParams(10, stop=(" " + stop_word, "never-seen"))
    stopped = generator.generate([GenerationRequest(PROMPTS[0], None, params)])[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == full.token_ids[: first_hit + 1]
    assert stopped.text == " ".join(f"w{t}" for t in full.token_ids[:first_hit])


def test_eos_ends_generation_unless_ignored(assets: tuple[Path, list[Path]]) -> None:
    base = assets[0]
    plain = OfflineGenerator(base).generate(
        [GenerationRequest(PROMPTS[3], None, SamplingParams(8))]
    )
    eos = plain[0].token_ids[2]
    (base / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos]}))
    try:
        gen = OfflineGenerator(base)
        ended = gen.generate([GenerationRequest(PROMPTS[3], None, SamplingParams(8))])[0]
        first = plain[0].token_ids.index(eos)
        assert ended.token_ids == plain[0].token_ids[: first + 1]
        assert ended.finish_reason == "stop"
        ignoring = SamplingParams(8, ignore_eos=True)
        assert gen.generate([GenerationRequest(PROMPTS[3], None, ignoring)]) == plain
    finally:
        (base / "generation_config.json").unlink()


def test_waves_give_the_same_results(assets: tuple[Path, list[Path]]) -> None:
    base, adapters = assets
    requests = mixed_requests(adapters, SamplingParams(6, temperature=1.0, seed=1))
    one_wave = OfflineGenerator(base, GeneratorConfig(max_loras=2, max_lora_rank=16))
    waves = OfflineGenerator(base, GeneratorConfig(max_loras=2, max_lora_rank=16, max_batch_size=3))
    assert one_wave.generate(requests) == waves.generate(requests)


def test_too_many_distinct_adapters_is_a_capacity_error(assets: tuple[Path, list[Path]]) -> None:
    base, adapters = assets
    small = OfflineGenerator(base, GeneratorConfig(max_loras=1, max_lora_rank=16))
    requests = [GenerationRequest("w3", a, SamplingParams(2)) for a in adapters]
    with pytest.raises(CapacityError):
        small.generate(requests)
    assert small.pool.occupied_slots() == ()
    # One at a time they fit: the second evicts the first.
    results = [small.generate([r])[0] for r in requests]
    assert all(isinstance(r, GenerationResult) for r in results)
    assert small.pool.occupied_slots() == (0,)


def test_invalid_adapter_is_rejected_before_loading(
    assets: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    base, adapters = assets
    broken = tmp_path / "broken"
    broken.mkdir()
    config = json.loads((adapters[0] / "adapter_config.json").read_text())
    (broken / "adapter_config.json").write_text(json.dumps({**config, "r": 0}))
    (broken / "adapter_model.safetensors").write_bytes(
        (adapters[0] / "adapter_model.safetensors").read_bytes()
    )
    gen = OfflineGenerator(base, GeneratorConfig(max_loras=2, max_lora_rank=16))
    with pytest.raises(AdapterConfigError):
        gen.generate([GenerationRequest("w3", adapters[0]), GenerationRequest("w4", broken)])
    assert gen.pool.occupied_slots() == ()


def test_bfloat16_generation_runs_and_mostly_agrees(assets: tuple[Path, list[Path]]) -> None:
    base, adapters = assets
    requests = mixed_requests(adapters, SamplingParams(max_tokens=4, ignore_eos=True))
    config = GeneratorConfig(dtype=torch.bfloat16, max_loras=2, max_lora_rank=16)
    bf16 = OfflineGenerator(base, config).generate(requests)
    fp32 = OfflineGenerator(base, GeneratorConfig(max_loras=2, max_lora_rank=16)).generate(requests)
    agree = [a.token_ids[0] == b.token_ids[0] for a, b in zip(bf16, fp32, strict=True)]
    assert sum(agree) >= 3
