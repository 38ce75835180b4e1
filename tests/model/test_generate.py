"""Offline generation through the serving engine: mixed batches, seeded sampling, stop strings,
EOS, min_tokens, and more distinct adapters than GPU slots."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tiny_models import hf_model, save_tiny_model, save_word_tokenizer

from loraplex.artifacts.identity import sha256_file
from loraplex.engine.adapter_dir_store import AdapterDirStore
from loraplex.engine.offline import (
    OfflineConfig,
    OfflineEngine,
    OfflineRequest,
    OfflineResult,
)
from loraplex.errors import (
    AdapterConfigError,
    ArtifactNotFoundError,
    DigestMismatchError,
    InvalidRequestError,
)
from loraplex.sampling import SamplingParams

PROMPTS = ("w5 w17 w3 w40", "w8 w9", "w60 w61 w62 w63 w64 w65", "w11")
TWO_SLOTS = OfflineConfig(max_loras=2, max_lora_rank=16)


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
def engine(assets: tuple[Path, list[Path]]) -> Iterator[OfflineEngine]:
    with OfflineEngine(assets[0], TWO_SLOTS) as offline:
        yield offline


def mixed_requests(adapters: list[Path], params: SamplingParams) -> list[OfflineRequest]:
    choice = [adapters[0], None, adapters[1], adapters[0]]
    return [OfflineRequest(p, a, params) for p, a in zip(PROMPTS, choice, strict=True)]


def test_mixed_batch_equals_each_request_alone(
    engine: OfflineEngine, assets: tuple[Path, list[Path]]
) -> None:
    requests = mixed_requests(assets[1], SamplingParams(max_tokens=8, ignore_eos=True))
    together = engine.generate(requests)
    alone = [engine.generate([r])[0] for r in requests]
    assert together == alone
    assert all(r.finish_reason == "length" and len(r.token_ids) == 8 for r in together)
    assert together[0].text == " ".join(f"w{t}" for t in together[0].token_ids)
    assert together[0].prompt_tokens == 5  # BOS + four words
    assert together[0].token_ids != together[3].token_ids  # same adapter, other prompt


def test_greedy_equals_peft_generate(
    engine: OfflineEngine, assets: tuple[Path, list[Path]]
) -> None:
    from peft import PeftModel

    base, adapters = assets
    ours = engine.generate([OfflineRequest(PROMPTS[0], adapters[1], SamplingParams(8))])
    peft = PeftModel.from_pretrained(hf_model(base), adapters[1]).eval()
    ids = torch.tensor([engine.tokenizer.encode(PROMPTS[0])])
    with torch.no_grad():
        out = peft.generate(
            ids, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    assert list(ours[0].token_ids) == out[0, ids.shape[1] :].tolist()


def test_token_id_prompts_equal_their_text(engine: OfflineEngine) -> None:
    ids = tuple(engine.tokenizer.encode(PROMPTS[1]))
    by_text = engine.generate([OfflineRequest(PROMPTS[1], None, SamplingParams(6))])
    by_ids = engine.generate([OfflineRequest(ids, None, SamplingParams(6))])
    assert by_ids == by_text


def test_seeded_sampling_is_reproducible_and_batch_independent(
    engine: OfflineEngine, assets: tuple[Path, list[Path]]
) -> None:
    params = SamplingParams(max_tokens=12, temperature=1.5, top_p=0.95, seed=7, ignore_eos=True)
    requests = mixed_requests(assets[1], params)
    first = engine.generate(requests)
    assert engine.generate(requests) == first
    # The same request alone, or among different neighbours, draws the same tokens.
    assert engine.generate([requests[2]])[0] == first[2]
    neighbours = [OfflineRequest("w90 w91", None, SamplingParams(12, temperature=0.7))]
    assert engine.generate([*neighbours, requests[2]])[1] == first[2]
    reseeded = SamplingParams(max_tokens=12, temperature=1.5, top_p=0.95, seed=8, ignore_eos=True)
    other = engine.generate([OfflineRequest(PROMPTS[2], assets[1][1], reseeded)])
    assert other[0].token_ids != first[2].token_ids
    greedy = engine.generate([OfflineRequest(PROMPTS[2], assets[1][1], SamplingParams(12))])
    assert first[2].token_ids != greedy[0].token_ids


def test_top_k_one_is_greedy(engine: OfflineEngine) -> None:
    greedy = engine.generate([OfflineRequest(PROMPTS[1], None, SamplingParams(10))])
    sampled = SamplingParams(10, temperature=2.0, top_k=1, seed=3)
    assert engine.generate([OfflineRequest(PROMPTS[1], None, sampled)]) == greedy


def test_stop_string_cuts_text_and_ends_generation(engine: OfflineEngine) -> None:
    full = engine.generate([OfflineRequest(PROMPTS[0], None, SamplingParams(10))])[0]
    stop_word = f"w{full.token_ids[4]}"
    assert f"w{full.token_ids[0]}" != stop_word  # the cut point is the first occurrence
    first_hit = [f"w{t}" for t in full.token_ids].index(stop_word)
    params = SamplingParams(10, stop=(" " + stop_word, "never-seen"))
    stopped = engine.generate([OfflineRequest(PROMPTS[0], None, params)])[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == full.token_ids[: first_hit + 1]
    assert stopped.text == " ".join(f"w{t}" for t in full.token_ids[:first_hit])


@pytest.fixture
def eos_model(assets: tuple[Path, list[Path]]) -> Iterator[tuple[Path, int, OfflineResult]]:
    """The base model with a token it greedily produces third declared its EOS."""
    base = assets[0]
    with OfflineEngine(base) as plain:
        free = plain.generate([OfflineRequest(PROMPTS[3], None, SamplingParams(8))])[0]
    eos = free.token_ids[2]
    (base / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos]}))
    try:
        yield base, eos, free
    finally:
        (base / "generation_config.json").unlink()


def test_eos_ends_generation_unless_ignored(eos_model: tuple[Path, int, OfflineResult]) -> None:
    base, eos, free = eos_model
    with OfflineEngine(base) as engine:
        ended = engine.generate([OfflineRequest(PROMPTS[3], None, SamplingParams(8))])[0]
        ignoring = SamplingParams(8, ignore_eos=True)
        assert engine.generate([OfflineRequest(PROMPTS[3], None, ignoring)])[0] == free
    first = free.token_ids.index(eos)
    assert ended.token_ids == free.token_ids[: first + 1]
    assert ended.finish_reason == "stop"


def test_min_tokens_holds_off_eos_and_stop_strings(
    eos_model: tuple[Path, int, OfflineResult],
) -> None:
    base, eos, free = eos_model
    first = free.token_ids.index(eos)
    at_least = first + 3
    stop_word = f"w{free.token_ids[0]}"  # produced first: a stop string that would end at once
    params = SamplingParams(8, min_tokens=at_least, stop=(stop_word,))
    with OfflineEngine(base) as engine:
        held = engine.generate([OfflineRequest(PROMPTS[3], None, params)])[0]
    assert len(held.token_ids) >= at_least
    assert eos not in held.token_ids[:at_least]  # EOS is not sampled before min_tokens
    assert held.text.startswith(stop_word)  # a stop string inside the first tokens is text


def test_fewer_slots_than_adapters_serves_them_in_turn(assets: tuple[Path, list[Path]]) -> None:
    base, adapters = assets
    requests = [OfflineRequest("w3 w4", a, SamplingParams(4, ignore_eos=True)) for a in adapters]
    with OfflineEngine(base, OfflineConfig(max_loras=1, max_lora_rank=16)) as one_slot:
        together = one_slot.generate(requests)
        assert len(one_slot.runtime.pool.occupied_slots()) == 1
    with OfflineEngine(base, TWO_SLOTS) as two_slots:
        assert two_slots.generate(requests) == together
    assert together[0].token_ids != together[1].token_ids


def test_a_small_batch_size_gives_the_same_results(assets: tuple[Path, list[Path]]) -> None:
    base, adapters = assets
    requests = mixed_requests(adapters, SamplingParams(6, temperature=1.0, seed=1))
    small = OfflineConfig(max_loras=2, max_lora_rank=16, max_num_seqs=3)
    with OfflineEngine(base, TWO_SLOTS) as wide, OfflineEngine(base, small) as narrow:
        assert wide.generate(requests) == narrow.generate(requests)


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
    with OfflineEngine(base, TWO_SLOTS) as engine:
        with pytest.raises(AdapterConfigError):
            engine.generate([OfflineRequest("w3", adapters[0]), OfflineRequest("w4", broken)])
        assert engine.runtime.pool.occupied_slots() == ()


def test_adapter_files_are_read_in_place_and_verified(
    assets: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    weights = tmp_path / "adapter_model.safetensors"
    weights.write_bytes((assets[1][0] / "adapter_model.safetensors").read_bytes())
    digest = sha256_file(weights)
    store = AdapterDirStore()
    store.put_file(weights, digest)
    assert store.exists(digest) and list(store.digests()) == [digest]
    assert b"".join(store.read(digest)) == weights.read_bytes()
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # edited after it was validated
    weights.write_bytes(bytes(data))
    with pytest.raises(DigestMismatchError):
        b"".join(store.read(digest))
    store.delete(digest)
    with pytest.raises(ArtifactNotFoundError):
        b"".join(store.read(digest))


def test_an_empty_prompt_is_an_invalid_request(engine: OfflineEngine) -> None:
    with pytest.raises(InvalidRequestError, match="prompt"):
        engine.generate([OfflineRequest((), None, SamplingParams(2))])


def test_bfloat16_generation_runs_and_mostly_agrees(assets: tuple[Path, list[Path]]) -> None:
    base, adapters = assets
    requests = mixed_requests(adapters, SamplingParams(max_tokens=4, ignore_eos=True))
    with OfflineEngine(base, OfflineConfig(dtype="bfloat16", max_loras=2, max_lora_rank=16)) as bf:
        bf16 = bf.generate(requests)
    with OfflineEngine(base, TWO_SLOTS) as fp:
        fp32 = fp.generate(requests)
    agree = [a.token_ids[0] == b.token_ids[0] for a, b in zip(bf16, fp32, strict=True)]
    assert sum(agree) >= 3
