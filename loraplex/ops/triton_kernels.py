"""The Triton kernel of the batched LoRA op: shrink and expand fused, over blocks of slot-grouped
tokens, in one launch per module.

It reads the block table built once per step by the backend's ``prepare``: one row per run of
at most ``BLOCK_M`` grouped positions that share a slot, ``(pos_lo, pos_hi, row0, num_rows)``:
positions ``[pos_lo, pos_hi)`` of the grouped order (``order[pos]`` is the token, or the
position itself without an order) use arena rows ``[row0, row0 + num_rows)``. So one launch
covers every slot, and a slot only costs its own rows (rounded up to ``BLOCK_R``), never the
widest slot's. Per program (a block and an output tile)::

    shrink: hidden[pos, r] = sum_k x[tok, k] * A[row0 + r, k]                for r < num_rows
    expand: out[tok, n]   += sum_r (hidden[pos, r] * scale[row0]) * B^T[row0 + r, n]

A slot whose scale is 0 in this module (the adapter does not target it) adds nothing and its
tokens' ``out`` rows are neither read nor written.

NOTE: Triton decides when a function is *decorated* whether it compiles for the GPU or runs in
its CPU interpreter, and its own library (``tl.zeros`` ...) is decorated when triton is first
imported. So ``TRITON_INTERPRET=1`` must be in the environment before the process first imports
triton, and stay set while kernels run; setting it later changes nothing (or, between the two
imports, would mix modes: refused below). ``INTERPRETED`` says which mode this process got.
"""

# Kernel parameters are Triton pointers and scalars, not Python types: leave them unannotated.
# mypy: allow-untyped-defs, allow-incomplete-defs, allow-untyped-decorators

from __future__ import annotations

import triton  # type: ignore[import-untyped, import-not-found, unused-ignore]
import triton.language as tl  # type: ignore[import-untyped, import-not-found, unused-ignore]
from triton.runtime.interpreter import (  # type: ignore[import-untyped, import-not-found, unused-ignore]
    InterpretedFunction,
)


@triton.jit
def lora_kernel(  # noqa: PLR0917 (a kernel's arguments are positional at launch)
    x_ptr,
    a_ptr,
    b_ptr,
    out_ptr,
    order_ptr,
    blocks_ptr,
    scale_ptr,
    d_in,
    d_out,
    stride_xm,
    stride_xk,
    stride_ar,
    stride_ak,
    stride_br,
    stride_bn,
    stride_om,
    stride_on,
    USE_ORDER: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """Grid ``(num_blocks, cdiv(d_out, BLOCK_N))``: one output tile of one block per program,
    which computes its block's rank-wide ``hidden`` itself (each of the ``cdiv(d_out, BLOCK_N)``
    programs of a block repeats that small shrink: cheaper on a GPU than a second launch and a
    buffer between them). Each (token, column) has one owner, so the read-add-write of ``out``
    needs no atomics."""
    meta = blocks_ptr + tl.program_id(0) * 4
    pos_lo, pos_hi = tl.load(meta), tl.load(meta + 1)
    row0, num_rows = tl.load(meta + 2), tl.load(meta + 3)
    scale = tl.load(scale_ptr + row0).to(tl.float32)
    # An untargeted module (scale 0) leaves the block empty: no out row is read or written.
    pos_hi = tl.where(scale != 0, pos_hi, pos_lo)
    num_rows = tl.where(scale != 0, num_rows, 0)
    pos = pos_lo + tl.arange(0, BLOCK_M)
    in_block = pos < pos_hi
    if USE_ORDER:
        tok = tl.load(order_ptr + pos, mask=in_block, other=0).to(tl.int64)
    else:
        tok = pos.to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    in_n = offs_n < d_out
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r0 in range(0, num_rows, BLOCK_R):
        offs_r = r0 + tl.arange(0, BLOCK_R)
        in_rank = offs_r < num_rows
        rows = (row0 + offs_r).to(tl.int64)
        # shrink: hidden[pos, r] = sum_k x[tok, k] * A[row0 + r, k], in float32
        hidden = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
        for k0 in range(0, d_in, BLOCK_K):
            k = k0 + offs_k
            in_k = k < d_in
            xs = tl.load(
                x_ptr + tok[:, None] * stride_xm + k[None, :] * stride_xk,
                mask=in_block[:, None] & in_k[None, :],
                other=0.0,
            )
            a_t = tl.load(
                a_ptr + rows[None, :] * stride_ar + k[:, None] * stride_ak,
                mask=in_rank[None, :] & in_k[:, None],
                other=0.0,
            )
            if DOT_FP32:
                xs, a_t = xs.to(tl.float32), a_t.to(tl.float32)
            hidden = tl.dot(xs, a_t, hidden, input_precision=DOT_PRECISION)
        # expand: out[tok, n] += sum_r (hidden[pos, r] * scale) * B^T[row0 + r, n]
        lora_b_t = tl.load(
            b_ptr + rows[:, None] * stride_br + offs_n[None, :] * stride_bn,
            mask=in_rank[:, None] & in_n[None, :],
            other=0.0,
        )
        # Half-precision weights meet a half-precision operand (tensor cores); the sum stays fp32.
        scaled = (hidden * scale).to(lora_b_t.dtype)
        if DOT_FP32:
            scaled, lora_b_t = scaled.to(tl.float32), lora_b_t.to(tl.float32)
        acc = tl.dot(scaled, lora_b_t, acc, input_precision=DOT_PRECISION)
    out_ptrs = out_ptr + tok[:, None] * stride_om + offs_n[None, :] * stride_on
    touched = in_block[:, None] & in_n[None, :]
    before = tl.load(out_ptrs, mask=touched, other=0.0)
    tl.store(out_ptrs, (before.to(tl.float32) + acc).to(before.dtype), mask=touched)


INTERPRETED: bool = isinstance(lora_kernel, InterpretedFunction)
if isinstance(tl.zeros, InterpretedFunction) != INTERPRETED:
    raise ImportError(
        "TRITON_INTERPRET changed between importing triton and loraplex's kernels; expected it "
        "set (or unset) before the first import of triton"
    )
