"""Logprobs of sampled tokens and of prompt tokens (echo) through the serving engine, against a
transformers + PEFT forward of the same adapter (float32, within 1e-4): mixed adapters in one
batch, rows with and without logprobs in the same step, chunked prefill, a cached prefix."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import hf_model, save_tiny_model, save_word_tokenizer

from loraplex.engine.offline import OfflineConfig, OfflineEngine, OfflineRequest, OfflineResult
from loraplex.sampling import SamplingParams, TokenLogprob

PROMPTS = ("w5 w17 w3 w40", "w8 w9", "w60 w61 w62 w63 w64 w65", "w11 w12 w13")
LONG_PROMPT = " ".join(f"w{3 + (i * 7) % 90}" for i in range(29))  # 30 tokens with BOS
TOL = 1e-4


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    """A tiny base model with a word tokenizer and two PEFT adapters with strong weights."""
    from peft import LoraConfig, get_peft_model

    root = tmp_path_factory.mktemp("lp")
    base = save_tiny_model(root / "tiny-lp", "qwen2")
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
        peft_model.save_pretrained(str(root / f"adapter{i}"))
        adapters.append(root / f"adapter{i}")
    return base, adapters


@pytest.fixture(scope="module")
def engine(assets: tuple[Path, list[Path]]) -> Iterator[OfflineEngine]:
    with OfflineEngine(assets[0], OfflineConfig(max_loras=2, max_lora_rank=16)) as offline:
        yield offline


@pytest.fixture(scope="module")
def reference(assets: tuple[Path, list[Path]]) -> Any:
    """log_softmax of a transformers (+ PEFT) forward over given token ids, per adapter."""
    from peft import PeftModel

    base, _ = assets

    @cache
    def model(adapter: Path | None) -> Any:
        if adapter is None:
            return hf_model(base)
        return PeftModel.from_pretrained(hf_model(base), adapter).eval()

    def logprobs(adapter: Path | None, ids: tuple[int, ...]) -> torch.Tensor:
        with torch.no_grad():
            logits = model(adapter)(torch.tensor([ids])).logits[0].float()
        return torch.log_softmax(logits, -1)

    return logprobs


def check_entry(entry: TokenLogprob, row: torch.Tensor, token: int, num_top: int) -> None:
    assert entry.token_id == token
    assert entry.logprob == pytest.approx(float(row[token]), abs=TOL)
    # Its rank as the reference ranks it (near-ties within float error may go either way).
    assert (
        int((row > row[token] + TOL).sum()) + 1
        <= entry.rank
        <= int((row >= row[token] - TOL).sum())
    )
    values, ids = row.topk(num_top)
    assert [t for t, _ in entry.top] == ids.tolist()
    assert [v for _, v in entry.top] == pytest.approx(values.tolist(), abs=TOL)


def check_against_reference(
    result: OfflineResult,
    request: OfflineRequest,
    prompt_ids: tuple[int, ...],
    reference: Any,
) -> None:
    rows = reference(request.adapter_dir, (*prompt_ids, *result.token_ids))
    params = request.params
    if params.logprobs is None:
        assert result.logprobs is None
    else:
        assert result.logprobs is not None and len(result.logprobs) == len(result.token_ids)
        for j, (entry, token) in enumerate(zip(result.logprobs, result.token_ids, strict=True)):
            check_entry(entry, rows[len(prompt_ids) + j - 1], token, params.logprobs)
    if params.prompt_logprobs is None:
        assert result.prompt_logprobs is None
        return
    found = result.prompt_logprobs
    assert found is not None and len(found) == len(prompt_ids) and found[0] is None
    for i in range(1, len(prompt_ids)):
        scored = found[i]
        assert scored is not None
        check_entry(scored, rows[i - 1], prompt_ids[i], params.prompt_logprobs)


def test_logprobs_match_peft_in_a_mixed_batch(
    engine: OfflineEngine, assets: tuple[Path, list[Path]], reference: Any
) -> None:
    a0, a1 = assets[1]
    plain = SamplingParams(max_tokens=5, ignore_eos=True)
    requests = [
        OfflineRequest(PROMPTS[0], a0, replace(plain, logprobs=3)),
        OfflineRequest(PROMPTS[1], None, plain),
        OfflineRequest(PROMPTS[2], a1, replace(plain, logprobs=0, prompt_logprobs=2)),
        OfflineRequest(PROMPTS[3], a0, replace(plain, prompt_logprobs=0)),
        OfflineRequest(PROMPTS[1], a1, replace(plain, logprobs=20, temperature=1.0, seed=3)),
    ]
    together = engine.generate(requests)
    for request, result in zip(requests, together, strict=True):
        prompt_ids = tuple(engine.tokenizer.encode(str(request.prompt)))
        check_against_reference(result, request, prompt_ids, reference)
    # Rows without the features get exactly what they get alone, and no logprobs.
    assert engine.generate([requests[1]])[0] == together[1]
    assert together[1].logprobs is None and together[1].prompt_logprobs is None
    assert together[2].logprobs is not None and together[2].logprobs[0].top == ()


def test_prompt_logprobs_with_chunked_prefill_and_a_cached_prefix(
    assets: tuple[Path, list[Path]], reference: Any
) -> None:
    adapter = assets[1][1]
    with OfflineEngine(assets[0], OfflineConfig(max_loras=2, max_lora_rank=16, block_size=4,
                                                max_num_seqs=4)) as offline:  # fmt: skip
        scheduler = offline.core.scheduler
        scheduler.config = replace(scheduler.config, max_num_batched_tokens=7)  # 30 = 5 chunks
        params = SamplingParams(max_tokens=3, ignore_eos=True, prompt_logprobs=4)
        request = OfflineRequest(LONG_PROMPT, adapter, params)
        prompt_ids = tuple(offline.tokenizer.encode(LONG_PROMPT))
        assert len(prompt_ids) == 30
        warm = offline.generate(
            [OfflineRequest(LONG_PROMPT, adapter, replace(params, prompt_logprobs=None))]
        )
        first, second = offline.generate([request]), offline.generate([request])
    # The warm-up cached the prompt's blocks; the echo runs still score every prompt position.
    assert first == second
    assert first[0].token_ids == warm[0].token_ids
    check_against_reference(first[0], request, prompt_ids, reference)


def test_forward_batch_returns_every_position_only_for_flagged_chunks() -> None:
    from loraplex.model.kv_cache import SequenceChunk
    from loraplex.model.llama import ForwardBatch

    chunks = [SequenceChunk(0, 0, 3), SequenceChunk(1, 5, 2), SequenceChunk(2, 0, 3)]
    batch = ForwardBatch.build(list(range(8)), chunks, all_logits=[False, True, False])
    assert batch.logits_indices.tolist() == [2, 3, 4, 7]
    with pytest.raises(ValueError, match="all_logits"):
        ForwardBatch.build(list(range(8)), chunks, all_logits=[True])
