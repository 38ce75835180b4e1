"""Key/value storage and the attention that reads it, behind one small interface.

The model hands each layer's new keys/values to ``KVCache.attend``, which stores them and
attends the queries over everything the sequence has cached. The cache owns the layout, so the
engine can swap this contiguous implementation for paged blocks without touching the model.

Flattened batch convention: the tokens of a forward are the concatenation of its
``SequenceChunk``s, in order. A chunk is a run of consecutive positions of one sequence,
``start_pos .. start_pos + num_tokens - 1``; prefill and decode chunks may be mixed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Protocol, TypeVar

import torch

from loraplex.errors import CapacityError
from loraplex.model.attention import chunk_attention, decode_attention
from loraplex.model.buffers import zeroed


@dataclass(frozen=True)
class SequenceChunk:
    """New tokens of one sequence in a forward."""

    seq_id: int  # cache handle from KVCache.allocate
    start_pos: int  # tokens already cached for the sequence = position of the first new token
    num_tokens: int  # new tokens in this forward (1 for decode)

    def __post_init__(self) -> None:
        if self.start_pos < 0:
            raise ValueError(f"start_pos {self.start_pos} is invalid; expected >= 0")
        if self.num_tokens < 1:
            raise ValueError(f"num_tokens {self.num_tokens} is invalid; expected >= 1")


@dataclass(frozen=True)
class AttentionShape:
    """What attention needs to know about the model."""

    num_layers: int  # decoder layers
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads
    head_dim: int  # per-head width
    sliding_windows: tuple[int | None, ...]  # per layer; None = full causal attention


PlanT = TypeVar("PlanT")


class KVCache(Protocol[PlanT]):
    """Storage for cached keys/values plus attention over it (the engine's plug point)."""

    def allocate(self) -> int:
        """Reserve storage for a new sequence; returns its ``seq_id``."""
        ...

    def free(self, seq_id: int) -> None:
        """Release a sequence's storage."""
        ...

    def plan(self, chunks: Sequence[SequenceChunk]) -> PlanT:
        """Per-forward metadata, built once and shared by every layer."""
        ...

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: PlanT
    ) -> torch.Tensor:
        """Store ``k``/``v`` [num_tokens, kv_heads, head_dim] and return attention output
        [num_tokens, heads * head_dim] for ``q`` [num_tokens, heads, head_dim]."""
        ...


@dataclass(frozen=True)
class ContiguousPlan:
    """Metadata for one forward over a ContiguousKVCache."""

    chunks: tuple[SequenceChunk, ...]  # the forward's sequences, in token order
    write_index: torch.Tensor  # [num_tokens * kv_heads] int64 rows of the flattened storage
    write_pos: torch.Tensor  # [num_tokens] int64 position of each token
    all_decode: bool  # every chunk is one token: one batched attention call
    rows: torch.Tensor  # [num_chunks] int64 cache rows, used when all_decode
    row_range: tuple[int, int] | None  # rows as [start, stop) when consecutive: a view, no gather
    max_kv_len: int  # longest cached length after this forward
    decode_mask: torch.Tensor | None  # [num_chunks, 1, 1, max_kv_len] additive 0/-inf, all_decode
    chunk_offsets: tuple[int, ...]  # first token index of each chunk in the flattened batch


class ContiguousKVCache:
    """One preallocated row of ``max_seq_len`` positions per sequence, per layer.

    Layout ``[layer][row, kv_head, position, head_dim]`` so a row slice is what scaled-dot-product
    attention reads directly. Decode batches attend in one call with a length mask; prefill
    chunks attend one sequence at a time (their lengths differ, and padding would waste work).
    """

    def __init__(
        self,
        shape: AttentionShape,
        max_seqs: int,
        max_seq_len: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if max_seqs < 1 or max_seq_len < 1:
            raise ValueError(
                f"max_seqs {max_seqs} / max_seq_len {max_seq_len} are invalid; expected >= 1"
            )
        self.shape = shape
        self.max_seqs = max_seqs
        self.max_seq_len = max_seq_len
        self.device = device
        self.dtype = dtype
        dims = (max_seqs, shape.num_kv_heads, max_seq_len, shape.head_dim)
        layers = range(shape.num_layers)
        self.keys = [zeroed(dims, dtype=dtype, device=device) for _ in layers]
        self.values = [zeroed(dims, dtype=dtype, device=device) for _ in layers]
        self._free_rows = list(range(max_seqs - 1, -1, -1))
        self._scale = shape.head_dim**-0.5

    def allocate(self) -> int:
        if not self._free_rows:
            raise CapacityError(f"KV cache: all {self.max_seqs} sequence rows are in use")
        return self._free_rows.pop()

    def free(self, seq_id: int) -> None:
        if not 0 <= seq_id < self.max_seqs or seq_id in self._free_rows:
            raise ValueError(f"seq_id {seq_id} is invalid; expected an allocated row")
        self._free_rows.append(seq_id)

    def plan(self, chunks: Sequence[SequenceChunk]) -> ContiguousPlan:
        rows = [c.seq_id for c in chunks]
        ends = [c.start_pos + c.num_tokens for c in chunks]
        if max(ends) > self.max_seq_len:
            raise CapacityError(f"KV cache: a sequence reaches {max(ends)} > {self.max_seq_len}")
        write_rows = torch.tensor([c.seq_id for c in chunks for _ in range(c.num_tokens)])
        write_pos = torch.tensor(
            [p for c in chunks for p in range(c.start_pos, c.start_pos + c.num_tokens)]
        )
        # Flattened storage [max_seqs * kv_heads * max_seq_len, head_dim]: one index_copy_ per
        # layer writes every new key (cheaper than advanced-index assignment).
        kv_heads = torch.arange(self.shape.num_kv_heads)
        flat_rows = write_rows[:, None] * self.shape.num_kv_heads + kv_heads[None, :]
        write_index = flat_rows * self.max_seq_len + write_pos[:, None]
        all_decode = all(c.num_tokens == 1 for c in chunks)
        consecutive = rows == list(range(rows[0], rows[0] + len(rows)))
        return ContiguousPlan(
            chunks=tuple(chunks),
            write_index=write_index.reshape(-1).to(self.device),
            write_pos=write_pos.to(self.device),
            all_decode=all_decode,
            rows=torch.tensor(rows, device=self.device),
            row_range=(rows[0], rows[0] + len(rows)) if consecutive else None,
            max_kv_len=max(ends),
            decode_mask=self._decode_mask(ends) if all_decode else None,
            chunk_offsets=tuple(accumulate((c.num_tokens for c in chunks[:-1]), initial=0)),
        )

    def _decode_mask(self, ends: list[int]) -> torch.Tensor:
        """Additive 0/-inf mask hiding positions past each sequence's end (a float mask: SDPA
        would convert a boolean one again in every layer)."""
        beyond = torch.arange(max(ends))[None, :] >= torch.tensor(ends)[:, None]
        mask = torch.zeros(beyond.shape, dtype=self.dtype).masked_fill(beyond, -torch.inf)
        return mask[:, None, None, :].to(self.device)

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        plan: ContiguousPlan,
    ) -> torch.Tensor:
        keys, values = self.keys[layer], self.values[layer]
        head_dim = self.shape.head_dim
        keys.view(-1, head_dim).index_copy_(0, plan.write_index, k.reshape(-1, head_dim))
        values.view(-1, head_dim).index_copy_(0, plan.write_index, v.reshape(-1, head_dim))
        window = self.shape.sliding_windows[layer]
        if plan.all_decode:
            out = self._attend_decode(q, keys, values, plan, window)
        else:
            out = torch.cat(
                [
                    self._attend_chunk(q, keys, values, chunk=chunk, offset=offset, window=window)
                    for chunk, offset in zip(plan.chunks, plan.chunk_offsets, strict=True)
                ]
            )
        return out.reshape(q.shape[0], -1)

    def _attend_decode(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        plan: ContiguousPlan,
        window: int | None,
    ) -> torch.Tensor:
        length = plan.max_kv_len
        if plan.row_range is not None:
            start, stop = plan.row_range
            k_rows, v_rows = keys[start:stop, :, :length], values[start:stop, :, :length]
        else:
            k_rows, v_rows = keys[plan.rows, :, :length], values[plan.rows, :, :length]
        if plan.decode_mask is None:
            raise ValueError("plan has no decode mask; expected an all-decode plan")
        return decode_attention(
            q, k_rows, v_rows, plan.decode_mask, plan.write_pos, window=window, scale=self._scale
        )

    def _attend_chunk(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        *,
        chunk: SequenceChunk,
        offset: int,
        window: int | None,
    ) -> torch.Tensor:
        end = chunk.start_pos + chunk.num_tokens
        return chunk_attention(
            q[offset : offset + chunk.num_tokens],
            keys[chunk.seq_id, :, :end],
            values[chunk.seq_id, :, :end],
            start_pos=chunk.start_pos,
            window=window,
            scale=self._scale,
        )
