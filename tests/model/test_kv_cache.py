"""Incremental decoding with the KV cache equals full recomputation, in any batch mix."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tiny_models import hf_model, rel_error

from loraplex.errors import CapacityError
from loraplex.model.checkpoint import load_checkpoint
from loraplex.model.kv_cache import ContiguousKVCache, SequenceChunk
from loraplex.model.llama import ForwardBatch, LlamaModel


def new_cache(model: LlamaModel, max_seqs: int = 4, max_seq_len: int = 32) -> ContiguousKVCache:
    return ContiguousKVCache(
        model.attention_shape, max_seqs, max_seq_len, dtype=model.dtype, device=model.device
    )


def full_logits(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    kv = new_cache(model, 1, len(ids))
    batch = ForwardBatch.build(ids, [SequenceChunk(kv.allocate(), 0, len(ids))], all_logits=True)
    return model.forward_batch(batch, kv)


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
def test_decode_steps_equal_full_recompute(arch: str, tiny_model: Callable[..., Path]) -> None:
    # Mistral's window (5) is shorter than the sequence, so decode must apply it too.
    model_dir = tiny_model(arch, sliding_window=5) if arch == "mistral" else tiny_model(arch)
    model = load_checkpoint(model_dir)
    ids = torch.randint(0, 97, (12,), generator=torch.Generator().manual_seed(7)).tolist()
    want = full_logits(model, ids)
    with torch.no_grad():
        assert rel_error(want, hf_model(model_dir)(torch.tensor([ids])).logits[0]) < 1e-4
    kv = new_cache(model)
    seq = kv.allocate()
    got = [model.forward_batch(ForwardBatch.build(ids[:4], [SequenceChunk(seq, 0, 4)]), kv)]
    for pos in range(4, len(ids)):
        chunk = SequenceChunk(seq, pos, 1)
        got.append(model.forward_batch(ForwardBatch.build([ids[pos]], [chunk]), kv))
    assert rel_error(torch.cat(got), want[3:]) < 1e-5


def test_mixed_prefill_decode_and_chunked_prefill_in_one_forward(
    tiny_model: Callable[..., Path],
) -> None:
    model = load_checkpoint(tiny_model("llama"))
    gen = torch.Generator().manual_seed(11)
    a, b, c = (torch.randint(0, 97, (n,), generator=gen).tolist() for n in (9, 7, 10))
    kv = new_cache(model)
    rows = [kv.allocate() for _ in range(4)]
    kv.free(rows[1])  # rows in use are not consecutive: the gather path runs
    row_a, row_b, row_c = rows[0], rows[2], rows[3]
    # Warm b (6 tokens cached) and c (4 tokens cached), then one forward that mixes a fresh
    # prefill of a, a decode step of b and a continued prefill of c's last 6 tokens.
    warm = [SequenceChunk(row_b, 0, 6), SequenceChunk(row_c, 0, 4)]
    model.forward_batch(ForwardBatch.build(b[:6] + c[:4], warm), kv)
    chunks = [SequenceChunk(row_a, 0, 9), SequenceChunk(row_b, 6, 1), SequenceChunk(row_c, 4, 6)]
    batch = ForwardBatch.build(a + b[6:] + c[4:], chunks, all_logits=True)
    got = model.forward_batch(batch, kv)
    want = torch.cat([full_logits(model, a), full_logits(model, b)[6:], full_logits(model, c)[4:]])
    assert rel_error(got, want) < 1e-5


def test_batched_decode_equals_single_sequence_decode(tiny_model: Callable[..., Path]) -> None:
    model = load_checkpoint(tiny_model("qwen2"))
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 97, (n,), generator=gen).tolist() for n in (3, 8, 5, 11)]
    kv = new_cache(model)
    rows = [kv.allocate() for _ in prompts]
    flat = [t for p in prompts for t in p]
    chunks = [SequenceChunk(r, 0, len(p)) for r, p in zip(rows, prompts, strict=True)]
    model.forward_batch(ForwardBatch.build(flat, chunks), kv)
    step = [SequenceChunk(r, len(p), 1) for r, p in zip(rows, prompts, strict=True)]
    got = model.forward_batch(ForwardBatch.build([5, 6, 7, 8], step), kv)
    want = torch.stack(
        [full_logits(model, [*p, t])[-1] for p, t in zip(prompts, [5, 6, 7, 8], strict=True)]
    )
    assert rel_error(got, want) < 1e-5


def test_capacity_and_handle_errors(tiny_model: Callable[..., Path]) -> None:
    model = load_checkpoint(tiny_model("llama"))
    kv = new_cache(model, max_seqs=2, max_seq_len=8)
    first, second = kv.allocate(), kv.allocate()
    with pytest.raises(CapacityError):
        kv.allocate()
    with pytest.raises(CapacityError):
        kv.plan([SequenceChunk(first, 6, 3)])
    kv.free(second)
    with pytest.raises(ValueError, match="seq_id"):
        kv.free(second)
    with pytest.raises(ValueError, match="num_tokens"):
        SequenceChunk(first, 0, 0)
    assert kv.allocate() == second
