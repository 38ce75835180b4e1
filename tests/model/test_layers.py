"""RMSNorm: the fused float32 path gives bit for bit what Llama's formula gives (norm in float32,
cast back, then the weight), so greedy outputs do not move; other dtypes take the formula."""

from __future__ import annotations

import pytest
import torch

from loraplex.model.layers import RMSNorm


def _llama_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def _norm(width: int, dtype: torch.dtype, generator: torch.Generator) -> RMSNorm:
    norm = RMSNorm(width, 1e-6, dtype=dtype, device=torch.device("cpu"))
    weight = torch.randn(width, generator=generator) * 0.1 + 1
    norm.weight.data.copy_(weight.to(dtype))
    return norm


@pytest.mark.parametrize("width", [16, 100, 256, 688, 1024, 4096, 5120])
@pytest.mark.parametrize("rows", [1, 7, 32, 512])
def test_float32_norm_is_bit_identical_to_the_llama_formula(width: int, rows: int) -> None:
    generator = torch.Generator().manual_seed(width * 1000 + rows)
    norm = _norm(width, torch.float32, generator)
    x = torch.randn(rows, width, generator=generator) * 3
    assert torch.equal(norm(x), _llama_norm(x, norm.weight, norm.eps))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_norm_casts_back_before_the_weight(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(7)
    norm = _norm(256, dtype, generator)
    x = (torch.randn(32, 256, generator=generator) * 3).to(dtype)
    assert torch.equal(norm(x), _llama_norm(x, norm.weight, norm.eps))
