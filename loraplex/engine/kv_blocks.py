"""Paged KV storage: ``model.kv_cache.KVCache`` over fixed-size blocks from a ``BlockManager``.

Per layer, keys and values live in one flat tensor ``[num_blocks * block_size, kv_heads,
head_dim]``; a sequence's position ``p`` is row ``table[p // block_size] * block_size +
p % block_size``. ``plan`` grows block tables as needed (the scheduler has usually reserved the
blocks already) and precomputes, once per forward, the rows every layer writes and gathers.
The one-token (decode) sequences of a forward gather their rows padded to the longest and attend
in one call under a length mask, also when the forward mixes them with prefill chunks (the usual
step under continuous batching); prefill chunks attend one sequence at a time, as in
``ContiguousKVCache``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch

from loraplex.engine.blocks import BASE_NAMESPACE, BlockManager
from loraplex.model.attention import chunk_attention, decode_attention
from loraplex.model.kv_cache import AttentionShape, SequenceChunk


@dataclass(frozen=True)
class PagedPlan:
    """Metadata for one forward over a PagedKVCache."""

    chunks: tuple[SequenceChunk, ...]  # the forward's sequences, in token order
    write_rows: torch.Tensor  # [num_tokens] int64 storage row of each new token
    write_pos: torch.Tensor  # [num_tokens] int64 position of each new token
    chunk_rows: tuple[torch.Tensor, ...]  # per chunk: [end] int64 rows of positions 0..end-1
    chunk_offsets: tuple[int, ...]  # first token index of each chunk in the flattened batch
    all_decode: bool  # every chunk is one token: one batched attention call
    # The one-token chunks, attended together (all chunks when all_decode):
    decode_rows: torch.Tensor | None  # [num_decodes, max_kv_len] rows, padded; None: none
    decode_mask: torch.Tensor | None  # [num_decodes, 1, 1, max_kv_len] additive 0/-inf
    decode_tokens: torch.Tensor | None  # [num_decodes] their token indices (mixed plans only)
    prefill_chunks: tuple[int, ...] = ()  # indices of the longer chunks, attended one by one


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
        self.keys = [torch.zeros(dims, dtype=dtype, device=device) for _ in range(shape.num_layers)]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self._scale = shape.head_dim**-0.5

    def allocate(self, namespace: str = BASE_NAMESPACE) -> int:
        return self.blocks.allocate(namespace)

    def free(self, seq_id: int) -> None:
        self.blocks.free(seq_id)

    def plan(self, chunks: Sequence[SequenceChunk]) -> PagedPlan:
        size = self.blocks.block_size
        chunk_rows: list[torch.Tensor] = []
        for c in chunks:
            end = c.start_pos + c.num_tokens
            self.blocks.grow(c.seq_id, end)
            table = torch.tensor(self.blocks.block_table(c.seq_id), dtype=torch.int64)
            positions = torch.arange(end)
            chunk_rows.append(table[positions // size] * size + positions % size)
        write_rows = torch.cat([r[c.start_pos :] for r, c in zip(chunk_rows, chunks, strict=True)])
        write_pos = torch.cat(
            [torch.arange(c.start_pos, c.start_pos + c.num_tokens) for c in chunks]
        )
        offsets = tuple(accumulate((c.num_tokens for c in chunks[:-1]), initial=0))
        decodes = [i for i, c in enumerate(chunks) if c.num_tokens == 1]
        all_decode = len(decodes) == len(chunks)
        decode_rows = decode_mask = decode_tokens = None
        if decodes:
            decode_rows, decode_mask = self._decode_layout([chunk_rows[i] for i in decodes])
            if not all_decode:
                decode_tokens = torch.tensor([offsets[i] for i in decodes], device=self.device)
        return PagedPlan(
            chunks=tuple(chunks),
            write_rows=write_rows.to(self.device),
            write_pos=write_pos.to(self.device),
            chunk_rows=tuple(r.to(self.device) for r in chunk_rows),
            chunk_offsets=offsets,
            all_decode=all_decode,
            decode_rows=decode_rows,
            decode_mask=decode_mask,
            decode_tokens=decode_tokens,
            prefill_chunks=tuple(i for i, c in enumerate(chunks) if c.num_tokens > 1),
        )

    def _decode_layout(self, chunk_rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows padded to the longest sequence (padding reads the all-zero pad row, masked out)
        and the additive mask hiding the padding."""
        lengths = torch.tensor([r.numel() for r in chunk_rows])
        longest = int(lengths.max())
        rows = torch.full((len(chunk_rows), longest), self._pad_row, dtype=torch.int64)
        for i, r in enumerate(chunk_rows):
            rows[i, : r.numel()] = r
        beyond = torch.arange(longest)[None, :] >= lengths[:, None]
        mask = torch.zeros(beyond.shape, dtype=self.dtype).masked_fill(beyond, -torch.inf)
        return rows.to(self.device), mask[:, None, None, :].to(self.device)

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: PagedPlan
    ) -> torch.Tensor:
        keys, values = self.keys[layer], self.values[layer]
        keys.index_copy_(0, plan.write_rows, k)
        values.index_copy_(0, plan.write_rows, v)
        window = self.shape.sliding_windows[layer]
        if plan.all_decode:
            out = self._attend_decode(
                q, plan.write_pos, keys=keys, values=values, plan=plan, window=window
            )
            return out.reshape(q.shape[0], -1)
        out = torch.empty_like(q)
        if plan.decode_tokens is not None:
            tokens = plan.decode_tokens
            part = self._attend_decode(
                q.index_select(0, tokens),
                plan.write_pos.index_select(0, tokens),
                keys=keys,
                values=values,
                plan=plan,
                window=window,
            )
            out.index_copy_(0, tokens, part)
        for i in plan.prefill_chunks:
            chunk, offset = plan.chunks[i], plan.chunk_offsets[i]
            out[offset : offset + chunk.num_tokens] = self._attend_chunk(
                q, keys, values, chunk=chunk, rows=plan.chunk_rows[i], offset=offset, window=window
            )
        return out.reshape(q.shape[0], -1)

    def _attend_decode(
        self,
        q: torch.Tensor,
        write_pos: torch.Tensor,
        *,
        keys: torch.Tensor,
        values: torch.Tensor,
        plan: PagedPlan,
        window: int | None,
    ) -> torch.Tensor:
        if plan.decode_rows is None or plan.decode_mask is None:
            raise ValueError("plan has no decode layout; expected one-token chunks")
        num_seqs, length = plan.decode_rows.shape
        num_kv_heads = self.shape.num_kv_heads
        flat = plan.decode_rows.reshape(-1)
        k_rows = keys.index_select(0, flat).view(num_seqs, length, num_kv_heads, -1).transpose(1, 2)
        v_rows = values.index_select(0, flat).view(num_seqs, length, num_kv_heads, -1)
        v_rows = v_rows.transpose(1, 2)
        return decode_attention(
            q, k_rows, v_rows, plan.decode_mask, write_pos, window=window, scale=self._scale
        )

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
