"""The same model on CUDA: float32 matches the CPU, float16/bfloat16 generation tracks float32."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tiny_models import rel_error, save_word_tokenizer

from loraplex.engine.offline import OfflineConfig, OfflineEngine, OfflineRequest
from loraplex.model.checkpoint import load_checkpoint
from loraplex.model.kv_cache import ContiguousKVCache, SequenceChunk
from loraplex.model.llama import ForwardBatch
from loraplex.sampling import SamplingParams

pytestmark = pytest.mark.gpu


def logits_on(model_dir: Path, device: str, dtype: torch.dtype) -> torch.Tensor:
    model = load_checkpoint(model_dir, dtype=dtype, device=device)
    kv = ContiguousKVCache(model.attention_shape, 3, 32, dtype=dtype, device=model.device)
    lengths = (5, 9, 1)
    chunks = [SequenceChunk(kv.allocate(), 0, n) for n in lengths]
    ids = torch.arange(3, 3 + sum(lengths))
    model.forward_batch(ForwardBatch.build(ids, chunks, device=model.device), kv)
    step = [SequenceChunk(c.seq_id, c.num_tokens, 1) for c in chunks]
    decode = ForwardBatch.build([7, 8, 9], step, device=model.device)
    return model.forward_batch(decode, kv).float().cpu()


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
def test_cuda_float32_matches_cpu(arch: str, tiny_model: Callable[..., Path]) -> None:
    model_dir = tiny_model(arch, sliding_window=4) if arch == "mistral" else tiny_model(arch)
    cpu = logits_on(model_dir, "cpu", torch.float32)
    assert rel_error(logits_on(model_dir, "cuda", torch.float32), cpu) < 1e-4
    for dtype in (torch.float16, torch.bfloat16):
        assert rel_error(logits_on(model_dir, "cuda", dtype), cpu) < 3e-2


def test_cuda_half_generation_tracks_cpu(tiny_model: Callable[..., Path]) -> None:
    model_dir = tiny_model("llama")
    save_word_tokenizer(model_dir)
    params = SamplingParams(max_tokens=4, temperature=0.8, seed=5, ignore_eos=True)
    requests = [OfflineRequest(p, None, params) for p in ("w5 w6", "w9", "w40 w41 w42")]
    greedy = [OfflineRequest(r.prompt, None, SamplingParams(4)) for r in requests]
    with OfflineEngine(model_dir, OfflineConfig(dtype="float16", device="cuda")) as cuda:
        results = cuda.generate(requests)
        assert cuda.generate(requests) == results  # seeded CUDA sampling repeats
        half = cuda.generate(greedy)
    with OfflineEngine(model_dir) as on_cpu:
        cpu = on_cpu.generate(greedy)
    assert sum(a.token_ids[0] == b.token_ids[0] for a, b in zip(cpu, half, strict=True)) >= 2
