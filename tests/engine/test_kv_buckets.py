"""Decode length buckets: the partition (pure) and attention over it (equal to one padded batch
and to each sequence alone, fp32 < 1e-5)."""

from __future__ import annotations

import itertools
from functools import partial
from unittest import mock

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loraplex.engine.kv import paged as paged_module
from loraplex.engine.kv.blocks import BlockManager
from loraplex.engine.kv.buckets import MAX_DECODE_BUCKETS, partition_by_length
from loraplex.engine.kv.paged import PagedKVCache
from loraplex.model.kv_cache import AttentionShape, SequenceChunk

TOL = 1e-5


def _cost(lengths: list[int], buckets: tuple[tuple[int, ...], ...], overhead: int) -> int:
    return sum(len(b) * max(lengths[i] for i in b) for b in buckets) + overhead * len(buckets)


def _brute_force_cost(lengths: list[int], max_buckets: int, overhead: int) -> int:
    ordered, n = sorted(lengths), len(lengths)
    costs = []
    for k in range(1, min(max_buckets, n) + 1):
        for cuts in itertools.combinations(range(1, n), k - 1):
            bounds = [0, *cuts, n]
            costs.append(
                sum((b - a) * ordered[b - 1] for a, b in itertools.pairwise(bounds)) + overhead * k
            )
    return min(costs)


def test_uniform_lengths_make_one_bucket_in_order() -> None:
    assert partition_by_length([75] * 26, overhead=0) == (tuple(range(26)),)
    assert partition_by_length([]) == ()


def test_two_clusters_make_two_buckets_shortest_first_each_in_order() -> None:
    lengths = [496, 75, 480, 76, 490, 75, 75, 500]
    assert partition_by_length(lengths, overhead=100) == ((1, 3, 5, 6), (0, 2, 4, 7))


def test_a_split_that_saves_less_than_its_overhead_is_not_made() -> None:
    lengths = [100, 100, 100, 110]  # one bucket pads 30 positions
    assert partition_by_length(lengths, overhead=30) == ((0, 1, 2, 3),)
    assert partition_by_length(lengths, overhead=29) == ((0, 1, 2), (3,))


def test_max_buckets_must_be_positive() -> None:
    try:
        partition_by_length([1, 2], max_buckets=0)
    except ValueError as exc:
        assert "max_buckets=0" in str(exc)
    else:
        raise AssertionError("max_buckets=0 was accepted")


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 600), min_size=1, max_size=9),
    max_buckets=st.integers(1, MAX_DECODE_BUCKETS + 1),
    overhead=st.sampled_from([0, 7, 100, 1024]),
)
def test_partition_is_optimal_covers_every_row_once_and_keeps_order(
    lengths: list[int], max_buckets: int, overhead: int
) -> None:
    buckets = partition_by_length(lengths, max_buckets=max_buckets, overhead=overhead)
    assert 1 <= len(buckets) <= max_buckets
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
    assert all(list(b) == sorted(b) for b in buckets)
    tops = [max(lengths[i] for i in b) for b in buckets]
    assert all(top < min(lengths[i] for i in b) for top, b in zip(tops, buckets[1:], strict=False))
    assert _cost(lengths, buckets, overhead) == _brute_force_cost(lengths, max_buckets, overhead)


def test_partition_never_exceeds_max_buckets_on_many_distinct_lengths() -> None:
    lengths = list(range(1, 400, 3))
    buckets = partition_by_length(lengths, overhead=0)
    assert len(buckets) == MAX_DECODE_BUCKETS
    assert _cost(lengths, buckets, 0) < len(lengths) * max(lengths)


SHAPE = dict(num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8)


def _attend(
    cache: PagedKVCache, chunks: list[SequenceChunk], qkv: tuple[torch.Tensor, ...]
) -> torch.Tensor:
    q, k, v = qkv
    return cache.attend(0, q, k, v, cache.plan(chunks))


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 60), min_size=1, max_size=10),
    window=st.sampled_from([None, 5]),
    mixed=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_bucketed_decode_equals_one_padded_batch_and_each_sequence_alone(
    lengths: list[int], window: int | None, mixed: bool, seed: int
) -> None:
    """Decodes over random cached lengths (all-decode, or around a fresh prompt and a continued
    prompt chunk), windowed or not: as many buckets as allowed, one padded bucket, and every
    chunk on its own give the same outputs."""
    shape = AttentionShape(**SHAPE, sliding_windows=(window,))
    cache = PagedKVCache(shape, BlockManager(256, 4), dtype=torch.float32,
                         device=torch.device("cpu"))  # fmt: skip
    gen = torch.Generator().manual_seed(seed)

    def qkv(num_tokens: int) -> tuple[torch.Tensor, ...]:
        heads = (SHAPE["num_heads"], SHAPE["num_kv_heads"], SHAPE["num_kv_heads"])
        return tuple(torch.randn(num_tokens, h, SHAPE["head_dim"], generator=gen) for h in heads)

    seqs = [cache.allocate() for _ in lengths]
    chunks = [SequenceChunk(s, 0, n) for s, n in zip(seqs, lengths, strict=True)]
    _attend(cache, chunks, qkv(sum(lengths)))  # fill the cache
    step = [SequenceChunk(s, n, 1) for s, n in zip(seqs, lengths, strict=True)]
    if mixed:
        fresh, continued = cache.allocate(), cache.allocate()
        _attend(cache, [SequenceChunk(continued, 0, 6)], qkv(6))
        step.insert(len(step) // 2, SequenceChunk(fresh, 0, 5))
        step.insert(1, SequenceChunk(continued, 6, 3))
    inputs = qkv(sum(c.num_tokens for c in step))
    many = partial(partition_by_length, overhead=0)
    with mock.patch.object(paged_module, "partition_by_length", many):
        bucketed = _attend(cache, step, inputs)
    one = partial(partition_by_length, max_buckets=1)
    with mock.patch.object(paged_module, "partition_by_length", one):
        padded = _attend(cache, step, inputs)
    assert (bucketed - padded).abs().max().item() < TOL
    offset = 0
    for chunk in step:
        part = slice(offset, offset + chunk.num_tokens)
        alone = _attend(cache, [chunk], tuple(t[part] for t in inputs))
        assert (bucketed[part] - alone).abs().max().item() < TOL
        offset += chunk.num_tokens
    cache.blocks.check_integrity()


def test_a_mixed_length_plan_buckets_its_decodes_and_pads_each_to_its_own_longest() -> None:
    shape = AttentionShape(**SHAPE, sliding_windows=(None,))
    cache = PagedKVCache(shape, BlockManager(1024, 4), dtype=torch.float32,
                         device=torch.device("cpu"))  # fmt: skip
    lengths = [400, 64, 400, 64, 64, 400, 64, 64]  # padding all to 401: 5 * 336 wasted
    seqs = [cache.allocate() for _ in lengths]
    for s, n in zip(seqs, lengths, strict=True):
        cache.blocks.grow(s, n)
    plan = cache.plan([SequenceChunk(s, n, 1) for s, n in zip(seqs, lengths, strict=True)])
    assert [b.rows.shape for b in plan.decode_buckets] == [(5, 65), (3, 401)]
    assert [b.tokens.tolist() for b in plan.decode_buckets if b.tokens is not None] == [
        [1, 3, 4, 6, 7],
        [0, 2, 5],
    ]
    uniform = cache.plan([SequenceChunk(s, 64, 1) for s in seqs[:3]])
    (bucket,) = uniform.decode_buckets
    assert bucket.tokens is None and bucket.rows.shape == (3, 65)
