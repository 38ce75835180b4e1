"""Paged KV must give the same logits as the contiguous cache (fp32, < 1e-5)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import pytest
import torch

from loraplex.engine.kv.blocks import BlockManager, kv_cache_bytes
from loraplex.engine.kv.paged import PagedKVCache
from loraplex.model.checkpoint import load_checkpoint
from loraplex.model.kv_cache import ContiguousKVCache, SequenceChunk
from loraplex.model.llama import ForwardBatch, LlamaModel

if TYPE_CHECKING:
    from loraplex.demo.assets import DemoAssets

TOL = 1e-5


@pytest.fixture(scope="module")
def model(demo_assets: DemoAssets) -> LlamaModel:
    torch.manual_seed(0)
    return load_checkpoint(demo_assets.base_model_dir, dtype=torch.float32, device="cpu")


def _forward(
    model: LlamaModel, kv: object, chunks: list[tuple[int, int, list[int]]]
) -> torch.Tensor:
    seq_chunks = [SequenceChunk(seq, start, len(toks)) for seq, start, toks in chunks]
    tokens = [t for _, _, toks in chunks for t in toks]
    batch = ForwardBatch.build(tokens, seq_chunks)
    return model.forward_batch(batch, kv)  # type: ignore[arg-type]


def test_paged_equals_contiguous_through_prefill_mixed_and_decode(model: LlamaModel) -> None:
    prompts = [list(range(5, 5 + n)) for n in (3, 11, 7)]
    contiguous = ContiguousKVCache(model.attention_shape, 3, 64, dtype=torch.float32,
                                   device=torch.device("cpu"))  # fmt: skip
    paged = PagedKVCache(model.attention_shape, BlockManager(32, 4), dtype=torch.float32,
                         device=torch.device("cpu"))  # fmt: skip
    c_ids = [contiguous.allocate() for _ in prompts]
    p_ids = [paged.allocate() for _ in prompts]
    lengths = [0, 0, 0]

    def step(plan: list[tuple[int, list[int]]]) -> None:
        c = _forward(model, contiguous, [(c_ids[i], lengths[i], t) for i, t in plan])
        p = _forward(model, paged, [(p_ids[i], lengths[i], t) for i, t in plan])
        assert (c - p).abs().max().item() < TOL
        for i, toks in plan:
            lengths[i] += len(toks)

    step([(0, prompts[0]), (1, prompts[1][:6])])  # prefill + a partial (chunked) prefill
    step([(0, [40]), (1, prompts[1][6:]), (2, prompts[2])])  # decode mixed with prefills
    for token in range(41, 47):  # pure decode steps over sequences of different lengths
        step([(0, [token]), (1, [token + 1]), (2, [token + 2])])
    paged.free(p_ids[1])
    step([(0, [50]), (2, [51])])
    paged.blocks.check_integrity()


def test_decodes_mixed_with_prefill_chunks_batch_together_in_any_order(model: LlamaModel) -> None:
    """A continuous-batching step: several one-token decodes around prefill chunks, the decodes
    attended in one call (out of token order) and the chunks one by one."""
    prompts = [list(range(9, 9 + n)) for n in (5, 13, 2, 9, 6)]
    contiguous = ContiguousKVCache(model.attention_shape, 5, 64, dtype=torch.float32,
                                   device=torch.device("cpu"))  # fmt: skip
    paged = PagedKVCache(model.attention_shape, BlockManager(64, 4), dtype=torch.float32,
                         device=torch.device("cpu"))  # fmt: skip
    c_ids = [contiguous.allocate() for _ in prompts]
    p_ids = [paged.allocate() for _ in prompts]
    lengths = [0] * len(prompts)

    def step(plan: list[tuple[int, list[int]]]) -> None:
        chunks = [(i, lengths[i], t) for i, t in plan]
        c = _forward(model, contiguous, [(c_ids[i], start, t) for i, start, t in chunks])
        p = _forward(model, paged, [(p_ids[i], start, t) for i, start, t in chunks])
        assert (c - p).abs().max().item() < TOL
        for i, toks in plan:
            lengths[i] += len(toks)

    step([(0, prompts[0]), (2, prompts[2])])
    step([(0, [60]), (1, prompts[1][:7]), (2, [61]), (3, prompts[3])])
    step([(3, [62]), (1, prompts[1][7:]), (0, [63]), (2, [64]), (4, prompts[4][:3])])
    plan = paged.plan([SequenceChunk(p_ids[i], lengths[i], 1) for i in (0, 2)]
                      + [SequenceChunk(p_ids[4], lengths[4], 3)])  # fmt: skip
    assert not plan.all_decode and plan.prefill_chunks == (2,)
    (bucket,) = plan.decode_buckets
    assert bucket.tokens is not None and bucket.tokens.tolist() == [0, 1]
    step([(2, [65]), (4, prompts[4][3:]), (0, [66]), (1, [67]), (3, [68])])
    paged.blocks.check_integrity()


def test_prefix_reuse_gives_identical_logits_and_stays_within_a_revision(
    model: LlamaModel,
) -> None:
    prompt = list(range(10, 23))  # 13 tokens: 3 full blocks of 4 reusable
    blocks = BlockManager(32, 4)
    paged = PagedKVCache(model.attention_shape, blocks, dtype=torch.float32,
                         device=torch.device("cpu"))  # fmt: skip
    first = paged.allocate("rev-a")
    full = _forward(model, paged, [(first, 0, prompt)])
    blocks.record(first, prompt)

    reuser = paged.allocate("rev-a")
    cached = blocks.match_prefix(reuser, prompt)
    assert cached == 12
    assert blocks.block_table(reuser)[:3] == blocks.block_table(first)[:3]
    tail = _forward(model, paged, [(reuser, cached, prompt[cached:])])
    assert (tail - full).abs().max().item() < TOL

    other = paged.allocate("rev-b")
    assert blocks.match_prefix(other, prompt) == 0
    again = _forward(model, paged, [(other, 0, prompt)])
    assert (again - full).abs().max().item() < TOL
    assert not set(blocks.block_table(other)) & set(blocks.block_table(first))
    for seq in (first, reuser, other):
        paged.free(seq)
    assert blocks.usage == 0
    blocks.check_integrity()


def test_decode_padding_never_reads_another_sequences_rows(model: LlamaModel) -> None:
    """A sequence's non-finite keys/values (an adapter with huge weights) stay its own: the
    padding of shorter decodes reads a row no sequence owns."""
    paged = PagedKVCache(model.attention_shape, BlockManager(32, 4), dtype=torch.float32,
                         device=torch.device("cpu"))  # fmt: skip
    poisoned, short, long = (paged.allocate() for _ in range(3))
    _forward(
        model, paged, [(poisoned, 0, [5, 6, 7]), (short, 0, [8, 9]), (long, 0, list(range(10, 30)))]
    )
    for layer in range(len(paged.keys)):  # the poisoned sequence holds block 0 (rows 0..3)
        paged.keys[layer][:4] = float("nan")
        paged.values[layer][:4] = float("nan")
    logits = _forward(model, paged, [(short, 2, [40]), (long, 20, [41])])
    assert bool(torch.isfinite(logits).all())


@pytest.mark.parametrize("window", [None, 3])
def test_equal_length_prompts_from_position_zero_attend_together(
    model: LlamaModel, window: int | None
) -> None:
    """Prompts of one length that start at position 0 attend in one call over their own keys,
    adjacent in the batch or not (a decode and another length between them), windowed or not:
    the same logits as each prompt alone on the contiguous cache."""
    shape = replace(model.attention_shape, sliding_windows=(window,) * model.config.num_layers)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 97, (n,), generator=gen).tolist() for n in (6, 6, 4, 6, 3)]
    paged = PagedKVCache(shape, BlockManager(32, 4), dtype=torch.float32,
                         device=torch.device("cpu"))  # fmt: skip
    decoding = paged.allocate()
    _forward(model, paged, [(decoding, 0, [7, 8, 9])])  # a sequence that decodes beside them
    order = [0, 1, 5, 2, 3, 4]  # two adjacent 6-token prompts, the decode, a 4, a third 6, a 3

    def chunks(ids: list[int]) -> list[tuple[int, int, list[int]]]:
        return [(decoding, 3, [10]) if i == 5 else (ids[i], 0, prompts[i]) for i in order]

    planned = [paged.allocate() for _ in prompts]
    plan = paged.plan([SequenceChunk(seq, start, len(t)) for seq, start, t in chunks(planned)])
    assert plan.prompt_groups == ((0, 1, 4), (3,), (5,)) and plan.prefill_chunks == ()
    got = _forward(model, paged, chunks(planned))
    for row, i in enumerate(order):
        alone = ContiguousKVCache(shape, 1, 16, dtype=torch.float32, device=torch.device("cpu"))
        seq = alone.allocate()
        if i == 5:
            _forward(model, alone, [(seq, 0, [7, 8, 9])])
            want = _forward(model, alone, [(seq, 3, [10])])
        else:
            want = _forward(model, alone, [(seq, 0, prompts[i])])
        assert (got[row] - want[0]).abs().max().item() < TOL
    paged.blocks.check_integrity()


def test_kv_cache_bytes_is_what_the_paged_cache_allocates(model: LlamaModel) -> None:
    shape = model.attention_shape
    paged = PagedKVCache(shape, BlockManager(8, 4), dtype=torch.float32, device=torch.device("cpu"))
    held = sum(t.nbytes for t in paged.keys + paged.values)
    assert held == kv_cache_bytes(shape.num_layers, shape.num_kv_heads, shape.head_dim, 32, 4)


def test_a_kv_cache_that_cannot_be_allocated_names_its_settings(model: LlamaModel) -> None:
    """It failed with the allocator's out-of-memory error alone, naming no setting."""
    blocks = BlockManager(1024, 10**12)  # past any address space (128 TiB on x86-64 Linux)
    with pytest.raises(ValueError, match=r"^num_kv_blocks 1024 x block_size 1000000000000 is "
                       r"invalid here; its KV cache needs \d+ bytes on cpu"):  # fmt: skip
        PagedKVCache(model.attention_shape, blocks, dtype=torch.float32, device=torch.device("cpu"))
