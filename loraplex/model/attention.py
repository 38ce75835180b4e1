"""Attention over gathered keys/values, shared by every KVCache implementation.

The caches differ in where keys and values live (contiguous rows, paged blocks); once a
cache has gathered them per sequence, the attention itself is the same.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def decode_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    write_pos: torch.Tensor,
    *,
    window: int | None,
    scale: float,
) -> torch.Tensor:
    """One new query per sequence: ``q`` [num_seqs, num_heads, head_dim] against ``keys`` /
    ``values`` [num_seqs, num_kv_heads, length, head_dim] under the additive ``mask``
    [num_seqs, 1, 1, length] (0 / -inf past each sequence's end); with a sliding ``window``,
    positions at or before ``write_pos - window`` are hidden too. Returns [num_seqs, num_heads,
    head_dim]."""
    num_seqs, num_kv_heads, length = keys.shape[0], keys.shape[1], keys.shape[2]
    if window is not None:
        positions = torch.arange(length, device=keys.device)[None, :]
        stale = positions <= (write_pos[:, None] - window)
        mask = mask.masked_fill(stale[:, None, None, :], -torch.inf)
    # Fold each kv head's query group into the query-length axis, so grouped-query attention
    # needs no repeated keys/values.
    group = q.shape[1] // num_kv_heads
    grouped = q.view(num_seqs, num_kv_heads, group, -1)
    out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=mask, scale=scale)
    return out.reshape(num_seqs, num_kv_heads * group, -1)


def chunk_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    *,
    start_pos: int,
    window: int | None,
    scale: float,
) -> torch.Tensor:
    """A chunk of one sequence's prompt: ``q`` [num_tokens, num_heads, head_dim] at positions
    ``start_pos ...`` against ``keys`` / ``values`` [num_kv_heads, start_pos + num_tokens,
    head_dim], causal (and windowed). Returns [num_tokens, num_heads, head_dim]."""
    mask = _causal_mask(start_pos, keys.shape[1], window, keys.device)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        keys[None],
        values[None],
        attn_mask=mask,
        is_causal=mask is None,
        scale=scale,
        enable_gqa=q.shape[1] != keys.shape[0],
    )
    return out[0].transpose(0, 1)


def prompt_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    *,
    window: int | None,
    scale: float,
) -> torch.Tensor:
    """Prompt chunks of equal length that all start at position 0, attended in one call:
    ``q`` [num_chunks, num_tokens, num_heads, head_dim] over the chunks' own ``keys`` /
    ``values`` [num_chunks, num_tokens, num_kv_heads, head_dim], causal (and windowed). Nothing
    before position 0 is cached, so the new keys are all there is to read. Returns
    [num_chunks, num_tokens, num_heads, head_dim]."""
    mask = _causal_mask(0, q.shape[1], window, q.device)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        keys.transpose(1, 2),
        values.transpose(1, 2),
        attn_mask=mask,
        is_causal=mask is None,
        scale=scale,
        enable_gqa=q.shape[2] != keys.shape[2],
    )
    return out.transpose(1, 2)


def _causal_mask(
    start_pos: int, end: int, window: int | None, device: torch.device
) -> torch.Tensor | None:
    """Which of positions ``0 .. end-1`` each query at ``start_pos .. end-1`` sees (causal, and
    within ``window``); None when plain causal attention from position 0 says it (SDPA's
    ``is_causal``)."""
    if not start_pos and window is None:
        return None
    q_pos = torch.arange(start_pos, end, device=device)[:, None]
    k_pos = torch.arange(end, device=device)[None, :]
    mask = k_pos <= q_pos
    return mask if window is None else mask & (k_pos > q_pos - window)
