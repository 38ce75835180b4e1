"""Paged KV storage: ``model.kv_cache.KVCache`` over fixed-size blocks from a ``BlockManager``.

Per layer, keys and values live in one flat tensor ``[num_blocks * block_size, kv_heads,
head_dim]``; a sequence's position ``p`` is row ``table[p // block_size] * block_size +
p % block_size``. ``plan`` grows block tables as needed (the scheduler has usually reserved the
blocks already) and precomputes, once per forward, the rows every layer writes and gathers.
The one-token (decode) sequences of a forward, also when the forward mixes them with prefill
chunks (the usual step under continuous batching), split into at most ``MAX_DECODE_BUCKETS``
buckets of similar KV length (``kv.buckets.partition_by_length``: padded positions against a
per-bucket overhead); each bucket gathers its rows padded to its own longest and attends in one
call under a length mask. Uniform lengths make one bucket, attended exactly as one padded batch
(an all-decode forward: no gather of queries, no scatter of results). Prompt chunks that start
at position 0 read nothing from the cache (their own new keys are all there is) and attend in
one call per chunk length; the other prefill chunks (after a cached prefix, or continuing a
chunked prompt) gather their rows and attend one sequence at a time, as in ``ContiguousKVCache``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch

from loraplex.engine.kv.blocks import BASE_NAMESPACE, BlockManager, kv_cache_bytes
from loraplex.engine.kv.buckets import partition_by_length
from loraplex.model.attention import chunk_attention, decode_attention, prompt_attention
from loraplex.model.buffers import zeroed
from loraplex.model.kv_cache import AttentionShape, SequenceChunk


@dataclass(frozen=True)
class DecodeBucket:
    """One-token chunks of similar KV length, gathered padded to the longest of them and
    attended in one call: a bucket per length range keeps short sequences from padding to a long
    one's length (see ``kv.buckets``)."""

    rows: torch.Tensor  # [n, max_kv_len] int64 storage rows; past an end: the never-written pad row
    mask: torch.Tensor  # [n, 1, 1, max_kv_len] additive 0/-inf hiding the padding
    positions: torch.Tensor  # [n] int64 position of each chunk's new token
    # [n] int64 the chunks' token indices in the batch, ascending; None: the whole batch in order
    # (an all-decode plan with one bucket: no gather of queries, no scatter of results)
    tokens: torch.Tensor | None


@dataclass(frozen=True)
class PagedPlan:
    """Metadata for one forward over a PagedKVCache."""

    chunks: tuple[SequenceChunk, ...]  # the forward's sequences, in token order
    write_rows: torch.Tensor  # [num_tokens] int64 storage row of each new token
    write_pos: torch.Tensor  # [num_tokens] int64 position of each new token
    chunk_offsets: tuple[int, ...]  # first token index of each chunk in the flattened batch
    all_decode: bool  # every chunk is one token
    decode_buckets: tuple[DecodeBucket, ...]  # the one-token chunks by length; (): none
    prefill_chunks: tuple[int, ...] = ()  # longer chunks after cached positions, one by one
    prefill_rows: tuple[torch.Tensor, ...] = ()  # per prefill chunk: [end] rows of 0..end-1
    # Longer chunks from position 0, grouped by length (each group attended in one call):
    prompt_groups: tuple[tuple[int, ...], ...] = ()


class PagedKVCache:
    """Keys/values in blocks shared by all sequences, with prefix reuse per adapter revision."""

    def __init__(
        self,
        shape: AttentionShape,
        blocks: BlockManager,
        *,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.shape = shape
        self.blocks = blocks
        self.dtype = dtype
        self.device = torch.device(device)
        rows = blocks.num_blocks * blocks.block_size
        # One extra row past every block, never written: decode padding reads it. NOTE: padding
        # must not read a block row, which may hold another sequence's non-finite keys/values
        # (an adapter with huge weights), and -inf masking cannot hide NaN (NaN * 0 is NaN).
        self._pad_row = rows
        dims = (rows + 1, shape.num_kv_heads, shape.head_dim)
        layers = range(shape.num_layers)
        try:
            self.keys = [zeroed(dims, dtype=dtype, device=self.device) for _ in layers]
            self.values = [zeroed(dims, dtype=dtype, device=self.device) for _ in layers]
        except (torch.OutOfMemoryError, MemoryError, OSError) as exc:  # mmap: OSError ENOMEM
            need = kv_cache_bytes(
                shape.num_layers, shape.num_kv_heads, shape.head_dim, rows, dtype.itemsize
            )
            raise ValueError(
                f"num_kv_blocks {blocks.num_blocks} x block_size {blocks.block_size} is invalid "
                f"here; its KV cache needs {need} bytes on {self.device}, which could not be "
                f"allocated ({type(exc).__name__}: {str(exc)[:200]})"
            ) from exc
        self._scale = shape.head_dim**-0.5

    def allocate(self, namespace: str = BASE_NAMESPACE) -> int:
        return self.blocks.allocate(namespace)

    def free(self, seq_id: int) -> None:
        self.blocks.free(seq_id)

    def plan(self, chunks: Sequence[SequenceChunk]) -> PagedPlan:
        # NOTE: built with a fixed handful of tensor ops whatever the batch (one padded block
        # table for all chunks), not a few per chunk: at decode batch sizes the per-op overhead
        # of a per-chunk loop cost more than the forward's attention.
        size = self.blocks.block_size
        ends = [c.start_pos + c.num_tokens for c in chunks]
        longest = max(ends)
        width = -(-longest // size)
        tables = []
        for c, end in zip(chunks, ends, strict=True):
            self.blocks.grow(c.seq_id, end)
            table = self.blocks.block_table(c.seq_id)[:width]
            tables.append(table + [0] * (width - len(table)))
        positions = torch.arange(longest)
        table_rows = torch.tensor(tables, dtype=torch.int64)[:, positions // size]
        rows = table_rows * size + positions % size  # [num_chunks, longest]; past an end: junk
        offsets = tuple(accumulate((c.num_tokens for c in chunks[:-1]), initial=0))
        flat = [i * longest + p for i, c in enumerate(chunks) for p in range(c.start_pos, ends[i])]
        write_rows = rows.view(-1)[torch.tensor(flat, dtype=torch.int64)]
        write_pos = torch.tensor(
            [p for c, end in zip(chunks, ends, strict=True) for p in range(c.start_pos, end)],
            dtype=torch.int64,
        )
        decodes = [i for i, c in enumerate(chunks) if c.num_tokens == 1]
        prefills = tuple(i for i, c in enumerate(chunks) if c.num_tokens > 1 and c.start_pos)
        groups: dict[int, list[int]] = {}
        for i, c in enumerate(chunks):
            if c.num_tokens > 1 and not c.start_pos:
                groups.setdefault(c.num_tokens, []).append(i)
        all_decode = not prefills and not groups
        buckets = partition_by_length([ends[i] for i in decodes])
        device = self.device
        return PagedPlan(
            chunks=tuple(chunks),
            write_rows=write_rows.to(device),
            write_pos=write_pos.to(device),
            prefill_rows=tuple(rows[i, : ends[i]].to(device) for i in prefills),
            chunk_offsets=offsets,
            all_decode=all_decode,
            decode_buckets=tuple(
                self._decode_bucket(
                    rows,
                    [decodes[j] for j in bucket],
                    ends,
                    offsets,
                    whole=all_decode and len(buckets) == 1,
                )
                for bucket in buckets
            ),
            prefill_chunks=prefills,
            prompt_groups=tuple(tuple(group) for group in groups.values()),
        )

    def _decode_bucket(
        self,
        rows: torch.Tensor,
        members: list[int],
        ends: list[int],
        offsets: tuple[int, ...],
        *,
        whole: bool,
    ) -> DecodeBucket:
        """The ``members`` one-token chunks' rows padded to the longest of them (padding reads
        the all-zero pad row, masked out) and the additive mask hiding the padding."""
        member_ends = [ends[i] for i in members]
        longest = max(member_ends)
        picked = rows if len(members) == rows.shape[0] else rows[members]
        beyond = torch.arange(longest)[None, :] >= torch.tensor(member_ends)[:, None]
        padded = picked[:, :longest].masked_fill(beyond, self._pad_row)
        mask = torch.zeros(beyond.shape, dtype=self.dtype).masked_fill(beyond, -torch.inf)
        tokens = None if whole else torch.tensor([offsets[i] for i in members], device=self.device)
        return DecodeBucket(
            rows=padded.to(self.device),
            mask=mask[:, None, None, :].to(self.device),
            positions=torch.tensor([e - 1 for e in member_ends], device=self.device),
            tokens=tokens,
        )

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: PagedPlan
    ) -> torch.Tensor:
        keys, values = self.keys[layer], self.values[layer]
        keys.index_copy_(0, plan.write_rows, k)
        values.index_copy_(0, plan.write_rows, v)
        window = self.shape.sliding_windows[layer]
        buckets = plan.decode_buckets
        if buckets and buckets[0].tokens is None:  # all decodes, one bucket: as they come
            out = self._attend_decode(q, keys, values, bucket=buckets[0], window=window)
            return out.reshape(q.shape[0], -1)
        out = torch.empty_like(q)
        for bucket in buckets:
            if bucket.tokens is None:
                raise ValueError("a whole-batch decode bucket must be its plan's only one")
            part = self._attend_decode(
                q.index_select(0, bucket.tokens), keys, values, bucket=bucket, window=window
            )
            out.index_copy_(0, bucket.tokens, part)
        for group in plan.prompt_groups:
            self._attend_prompts(q, k, v, out, plan=plan, group=group, window=window)
        for i, rows in zip(plan.prefill_chunks, plan.prefill_rows, strict=True):
            chunk, offset = plan.chunks[i], plan.chunk_offsets[i]
            out[offset : offset + chunk.num_tokens] = self._attend_chunk(
                q, keys, values, chunk=chunk, rows=rows, offset=offset, window=window
            )
        return out.reshape(q.shape[0], -1)

    def _attend_decode(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        *,
        bucket: DecodeBucket,
        window: int | None,
    ) -> torch.Tensor:
        num_seqs, length = bucket.rows.shape
        num_kv_heads = self.shape.num_kv_heads
        flat = bucket.rows.reshape(-1)
        k_rows = keys.index_select(0, flat).view(num_seqs, length, num_kv_heads, -1).transpose(1, 2)
        v_rows = values.index_select(0, flat).view(num_seqs, length, num_kv_heads, -1)
        v_rows = v_rows.transpose(1, 2)
        return decode_attention(
            q, k_rows, v_rows, bucket.mask, bucket.positions, window=window, scale=self._scale
        )

    def _attend_prompts(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        *,
        plan: PagedPlan,
        group: tuple[int, ...],
        window: int | None,
    ) -> None:
        """Equal-length chunks from position 0 over their own new keys/values, into ``out``."""
        n = plan.chunks[group[0]].num_tokens
        offsets = [plan.chunk_offsets[i] for i in group]
        first = offsets[0]
        if offsets == list(range(first, first + n * len(group), n)):  # adjacent: views
            span = slice(first, first + n * len(group))
            parts = [t[span].reshape(len(group), n, *t.shape[1:]) for t in (q, k, v)]
            result = prompt_attention(*parts, window=window, scale=self._scale)
            out[span] = result.flatten(0, 1)
            return
        parts = [torch.stack([t[o : o + n] for o in offsets]) for t in (q, k, v)]
        result = prompt_attention(*parts, window=window, scale=self._scale)
        for row, o in enumerate(offsets):
            out[o : o + n] = result[row]

    def _attend_chunk(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        *,
        chunk: SequenceChunk,
        rows: torch.Tensor,
        offset: int,
        window: int | None,
    ) -> torch.Tensor:
        return chunk_attention(
            q[offset : offset + chunk.num_tokens],
            keys.index_select(0, rows).transpose(0, 1),
            values.index_select(0, rows).transpose(0, 1),
            start_pos=chunk.start_pos,
            window=window,
            scale=self._scale,
        )
