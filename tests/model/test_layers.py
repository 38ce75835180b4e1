"""RMSNorm: the fused float32 path gives bit for bit what Llama's formula gives (norm in float32,
cast back, then the weight), so greedy outputs do not move; other dtypes take the formula.
The linear kernels: oneDNN's gives F.linear's result to float32 rounding, reads the weight as it
is now (no stale packed copy), and is chosen only where it runs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loraplex.model.layers import (
    ONEDNN_MIN_ROWS,
    RMSNorm,
    onednn_available,
    onednn_linear,
    resolve_linear_kernel,
)

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this torch has no oneDNN linear")


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


@needs_onednn
@pytest.mark.parametrize("rows", [2, 16, 67])
@pytest.mark.parametrize("bias", [False, True])
def test_onednn_linear_matches_f_linear(rows: int, bias: bool) -> None:
    generator = torch.Generator().manual_seed(rows)
    # a strided input (a column slice) and a weight that is a row view of a larger tensor
    x = torch.randn(rows, 2 * 96, generator=generator)[:, :96]
    weight = torch.randn(2 * 80, 96, generator=generator)[80:]
    b = torch.randn(80, generator=generator) if bias else None
    want = F.linear(x, weight, b)
    got = onednn_linear(x, weight, b)
    assert got.shape == want.shape
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_one_row_takes_f_linear() -> None:
    """A single-sequence decode row runs MKL's matrix-vector product, bit for bit."""
    generator = torch.Generator().manual_seed(2)
    weight, bias = torch.randn(256, 1024, generator=generator), torch.randn(256)
    for rows in (0, 1):
        x = torch.randn(rows, 1024, generator=generator)
        assert torch.equal(onednn_linear(x, weight, bias), F.linear(x, weight, bias))
    x = torch.randn(ONEDNN_MIN_ROWS, 1024, generator=generator)
    assert not torch.equal(onednn_linear(x, weight), F.linear(x, weight))


@needs_onednn
def test_onednn_linear_reads_the_weight_as_updated_in_place() -> None:
    """merge.py folds adapters into the weight in place: the next call must see it."""
    generator = torch.Generator().manual_seed(1)
    x, weight = torch.randn(16, 64, generator=generator), torch.randn(48, 64, generator=generator)
    before = onednn_linear(x, weight)
    weight.add_(torch.randn(48, 64, generator=generator))
    after = onednn_linear(x, weight)
    assert not torch.allclose(after, before)
    assert torch.allclose(after, F.linear(x, weight), rtol=1e-5, atol=1e-5)


def test_auto_linear_kernel_is_onednn_only_for_float32_on_a_cpu() -> None:
    cpu = torch.device("cpu")
    want = "onednn" if onednn_available() else "blas"
    assert resolve_linear_kernel("auto", torch.float32, cpu) == want
    assert resolve_linear_kernel("auto", torch.bfloat16, cpu) == "blas"
    assert resolve_linear_kernel("auto", torch.float32, torch.device("meta")) == "blas"
    assert resolve_linear_kernel("blas", torch.float32, cpu) == "blas"


def test_unknown_or_unrunnable_linear_kernel_is_refused() -> None:
    with pytest.raises(ValueError, match="linear_kernel 'cublas' is invalid"):
        resolve_linear_kernel("cublas", torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="linear_kernel 'onednn' is invalid on meta"):
        resolve_linear_kernel("onednn", torch.float32, torch.device("meta"))
