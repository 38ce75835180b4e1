from __future__ import annotations

import pytest

from loraplex.engine.kv.blocks import BlockManager
from loraplex.errors import CapacityError


def test_grow_free_and_usage() -> None:
    bm = BlockManager(4, 2)
    seq = bm.allocate()
    bm.grow(seq, 3)
    assert len(bm.block_table(seq)) == 2 and bm.usage == 0.5
    bm.grow(seq, 4)  # still fits two blocks
    assert len(bm.block_table(seq)) == 2
    other = bm.allocate()
    with pytest.raises(CapacityError):
        bm.grow(other, 5)
    assert bm.block_table(other) == []  # nothing taken on failure
    bm.free(seq)
    bm.free(other)
    assert bm.usage == 0.0
    bm.check_integrity()


def test_prefix_reuse_within_namespace_only() -> None:
    bm = BlockManager(8, 2)
    tokens = [1, 2, 3, 4, 5]
    first = bm.allocate("rev-a")
    bm.grow(first, 5)
    bm.record(first, tokens)
    same = bm.allocate("rev-a")
    assert bm.match_prefix(same, tokens) == 4
    assert bm.block_table(same) == bm.block_table(first)[:2]
    other = bm.allocate("rev-b")
    assert bm.match_prefix(other, tokens) == 0
    bm.check_integrity()
    bm.free(first)
    bm.free(same)
    # Freed blocks keep their digests until reallocated.
    again = bm.allocate("rev-a")
    assert bm.match_prefix(again, tokens) == 4
    bm.check_integrity()


def test_fully_cached_prompt_leaves_a_token_to_compute() -> None:
    bm = BlockManager(8, 2)
    tokens = [1, 2, 3, 4]
    first = bm.allocate()
    bm.grow(first, 4)
    bm.record(first, tokens)
    second = bm.allocate()
    assert bm.match_prefix(second, tokens) == 2


def test_reallocated_block_loses_its_digest() -> None:
    bm = BlockManager(2, 2)
    seq = bm.allocate()
    bm.grow(seq, 4)
    bm.record(seq, [1, 2, 3, 4])
    bm.free(seq)
    hog = bm.allocate()
    bm.grow(hog, 4)  # takes both blocks, overwriting their contents
    probe = bm.allocate()
    assert bm.match_prefix(probe, [1, 2, 3, 4, 5]) == 0
    bm.check_integrity()


def test_fills_says_whether_record_would_register_a_block() -> None:
    """``fills(seq, n)``: a block not yet registered is full at ``n`` tokens, exactly when
    ``record`` of ``n`` tokens registers one (the planner skips building the tokens otherwise)."""
    blocks = BlockManager(num_blocks=8, block_size=4)
    seq = blocks.allocate()
    tokens = list(range(1, 14))
    blocks.grow(seq, len(tokens))
    for n in range(len(tokens) + 1):
        hashed = blocks._seqs[seq].num_hashed  # NOTE: private on purpose: what record changed
        expected = blocks.fills(seq, n)
        blocks.record(seq, tokens[:n])
        assert (blocks._seqs[seq].num_hashed > hashed) == expected, n
    assert blocks._seqs[seq].num_hashed == 3
    other = blocks.allocate()  # blocks for fewer tokens than recorded: nothing to fill past them
    blocks.grow(other, 4)
    assert blocks.fills(other, 4) and not blocks.fills(other, 3)
    blocks.record(other, tokens[:8])
    assert not blocks.fills(other, 8)
