"""Building blocks whose parameter names match Hugging Face checkpoints, so loading is by name.

Parameters are allocated uninitialised: every value comes from the checkpoint, and random
initialisation of a large model would cost seconds for nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Module):
    """``y = x W^T (+ b)`` with ``W`` [d_out, d_in] as stored in checkpoints."""

    def __init__(
        self, d_in: int, d_out: int, bias: bool, *, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            torch.empty(d_out, d_in, dtype=dtype, device=device), requires_grad=False
        )
        self.bias = (
            nn.Parameter(torch.empty(d_out, dtype=dtype, device=device), requires_grad=False)
            if bias
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, cast back before the weight (as Llama does)."""

    def __init__(self, size: int, eps: float, *, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            torch.empty(size, dtype=dtype, device=device), requires_grad=False
        )
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # One fused kernel instead of six small ones (a decode step runs nine norms); in
            # float32 it is bit-identical to the lines below (tests/model/test_layers.py).
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Embedding(nn.Module):
    """Token embedding table [vocab_size, hidden_size]."""

    def __init__(
        self, vocab: int, hidden: int, *, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            torch.empty(vocab, hidden, dtype=dtype, device=device), requires_grad=False
        )

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(token_ids, self.weight)
