"""RMSNorm: the fused float32 path gives bit for bit what Llama's formula gives (norm in float32,
cast back, then the weight), so greedy outputs do not move; other dtypes take the formula.
The linear kernels: oneDNN's gives F.linear's result to float32 rounding, reads the weight as it
is now (no stale packed copy), and is chosen only where it runs; the packed one gives oneDNN's
result, repacks a weight written in place and forgets a freed one; outside its rows (one row on
an AVX-512 CPU neither Intel's nor a Zen 5, one row of a weight under 1024 x 1024 elements on a
Zen 5; one row or more than 32 without AVX-512) it takes F.linear."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from loraplex.engine.config import BASE_LINEAR_KERNELS
from loraplex.model import layers
from loraplex.model.layers import (
    LINEAR_KERNELS,
    ONEDNN_MIN_ROWS,
    ZEN5_ONE_ROW_MIN_ELEMENTS,
    PackedLinear,
    RMSNorm,
    cpu_family,
    cpu_vendor,
    linear_fn,
    onednn_available,
    onednn_linear,
    packed_available,
    packed_one_row_min_elements,
    packed_rows,
    resolve_linear_kernel,
)

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this torch has no oneDNN linear")
needs_packed = pytest.mark.skipif(not packed_available(), reason="this torch cannot pack weights")


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


def _dense_onednn(x: torch.Tensor, weight: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, weight, b, "none", [], "")
    return out


@needs_packed
@pytest.mark.parametrize("rows", [1, 2, 16, 67])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_gives_onednn_results_before_and_after_packing(rows: int, bias: bool) -> None:
    """The same kernel on the dense weight (not yet packed) and on its packed copy: equal
    results from two rows on (one row: oneDNN's kernels differ, float32 rounding), on a strided
    input and a row-view weight."""
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 2 * 96, generator=generator)[:, :96]
    weight = torch.randn(2 * 80, 96, generator=generator)[80:]
    b = torch.randn(80, generator=generator) if bias else None
    linear = PackedLinear((1, None))  # every row count on oneDNN, as on an AVX-512 CPU
    dense = linear(x, weight, b)
    assert len(linear) == 0 and not linear.is_current(weight)
    assert torch.equal(dense, _dense_onednn(x, weight, b))
    assert torch.allclose(dense, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)
    assert linear.pack(weight) and not linear.pack(weight)  # packed once
    assert linear.is_current(weight) and len(linear) == 1
    packed = linear(x, weight, b)
    assert torch.equal(packed, dense) if rows > 1 else torch.allclose(packed, dense, 1e-5, 1e-5)


def _ops_run(call: Callable[[], object]) -> set[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        call()
    return {event.name for event in prof.events()}


@needs_packed
@pytest.mark.parametrize("rows", [(1, None), (2, 32)])
def test_packed_linear_takes_f_linear_outside_its_rows(rows: tuple[int, int | None]) -> None:
    """Outside its rows a call is ``F.linear``'s (its result exactly, no oneDNN op); within
    them oneDNN's matmul on the packed copy."""
    generator = torch.Generator().manual_seed(rows[0])
    x = torch.randn(33, 64, generator=generator)
    weight = torch.randn(48, 64, generator=generator)
    linear = PackedLinear(rows)
    assert linear.pack(weight)
    onednn = "mkldnn::_linear_pointwise"
    for count in (1, 2, 32, 33):
        packed = count >= rows[0] and (rows[1] is None or count <= rows[1])
        assert (onednn in _ops_run(lambda n=count: linear(x[:n], weight))) == packed
        if not packed:
            assert torch.equal(linear(x[:count], weight), F.linear(x[:count], weight))
    assert onednn in _ops_run(lambda: linear(x[:4].view(2, 2, 64), weight))  # rows, not dim 0


@needs_packed
def test_packed_linear_runs_one_row_of_a_small_weight_through_f_linear() -> None:
    """With ``one_row_min_elements`` (a Zen 5's default) a one-row call on a smaller weight is
    ``F.linear``'s, on a weight that large the packed copy's; two rows run the copy either way."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2, 64, generator=generator)
    small, large = (
        torch.randn(47, 64, generator=generator),
        torch.randn(48, 64, generator=generator),
    )
    linear = PackedLinear((1, None), one_row_min_elements=48 * 64)
    assert linear.pack(small) and linear.pack(large)
    onednn = "mkldnn::_linear_pointwise"
    assert onednn not in _ops_run(lambda: linear(x[:1], small))
    assert torch.equal(linear(x[:1], small), F.linear(x[:1], small))
    assert onednn in _ops_run(lambda: linear(x[:1], large))
    assert onednn in _ops_run(lambda: linear(x, small))
    assert PackedLinear((1, None)).one_row_min_elements == 0  # explicit rows: every weight
    with pytest.raises(ValueError, match=r"one_row_min_elements -1 is invalid"):
        PackedLinear((1, None), one_row_min_elements=-1)


def test_packed_rows_follow_the_cpu_capability_vendor_and_family(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every row count runs packed on Intel and AMD Zen 5 (family 26 on) AVX-512 CPUs, 2 rows and
    more on another AVX-512 CPU (Zen 4: F.linear was faster at one row), 2 to 32 rows without
    AVX-512, whatever the vendor."""
    assert (
        packed_rows("AVX512", "GenuineIntel")
        == packed_rows("AVX512", "GenuineIntel", 6)
        == (1, None)
    )
    assert (
        packed_rows("AVX512", "AuthenticAMD", 26)
        == packed_rows("AVX512", "AuthenticAMD", 27)
        == (1, None)
    )
    for family in (25, 23, None):
        assert packed_rows("AVX512", "AuthenticAMD", family) == (2, None)
    assert packed_rows("AVX512", "AuthenticAMD") == packed_rows("AVX512", "", 26) == (2, None)
    for vendor, family in (
        ("GenuineIntel", 6),
        ("AuthenticAMD", 25),
        ("AuthenticAMD", 26),
        ("", None),
    ):
        assert (
            packed_rows("AVX2", vendor, family) == packed_rows("DEFAULT", vendor, family) == (2, 32)
        )
    for capability, vendor, family, rows in (
        ("AVX512", "GenuineIntel", 6, (1, None)),
        ("AVX512", "AuthenticAMD", 26, (1, None)),
        ("AVX512", "AuthenticAMD", 25, (2, None)),
        ("AVX2", "GenuineIntel", 6, (2, 32)),
    ):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda c=capability: c)
        monkeypatch.setattr(layers, "cpu_vendor", lambda v=vendor: v)
        monkeypatch.setattr(layers, "cpu_family", lambda f=family: f)
        linear = PackedLinear()
        assert packed_rows() == rows and (linear.min_rows, linear.max_rows) == rows
        zen5 = (capability, vendor, family) == ("AVX512", "AuthenticAMD", 26)
        elements = ZEN5_ONE_ROW_MIN_ELEMENTS if zen5 else 0
        assert packed_one_row_min_elements() == linear.one_row_min_elements == elements
    for bad in ((0, None), (4, 2)):
        with pytest.raises(ValueError, match=r"rows \(\d, \w+\) is invalid"):
            PackedLinear(bad)


def _cpuinfo(vendor: str, family: int, model: int, flags: str) -> str:
    """Two processors of /proc/cpuinfo as Linux writes them on x86 (the fields read and a few)."""
    one = (
        f"processor\t: {{n}}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
        f"model name\t: a CPU\nflags\t\t: fpu sse2 {flags}\n\n"
    )
    return one.format(n=0) + one.format(n=1)


@pytest.mark.parametrize(
    ("kind", "text", "capability", "rows", "one_row_elements"),
    [
        (
            "Xeon (AMX)",
            _cpuinfo("GenuineIntel", 6, 143, "avx2 avx512f amx_tile"),
            "AVX512",
            (1, None),
            0,
        ),
        ("EPYC Milan", _cpuinfo("AuthenticAMD", 25, 1, "avx2"), "AVX2", (2, 32), 0),
        (
            "EPYC Genoa",
            _cpuinfo("AuthenticAMD", 25, 17, "avx2 avx512f avx512_bf16"),
            "AVX512",
            (2, None),
            0,
        ),
        (
            "EPYC Turin",
            _cpuinfo("AuthenticAMD", 26, 2, "avx2 avx512f avx512_bf16"),
            "AVX512",
            (1, None),
            1024 * 1024,
        ),
        ("ARM", "processor\t: 0\nCPU implementer\t: 0x41\n", "DEFAULT", (2, 32), 0),
        ("no family", "processor\t: 0\nvendor_id\t: AuthenticAMD\n", "AVX512", (2, None), 0),
    ],
)
def test_packed_rows_per_cpu_kind_from_cpuinfo(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    kind: str,
    text: str,
    capability: str,
    rows: tuple[int, int | None],
    one_row_elements: int,
) -> None:
    """Each CPU kind measured in docs/benchmarks/peer.md, from its cpuinfo text as the engine
    reads it (torch's capability set to what torch reports there)."""
    info = tmp_path / "cpuinfo"
    info.write_text(text)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(layers, "cpu_vendor", lambda: cpu_vendor(str(info)))
    monkeypatch.setattr(layers, "cpu_family", lambda: cpu_family(str(info)))
    assert (packed_rows(), packed_one_row_min_elements()) == (rows, one_row_elements), kind


def test_cpu_vendor_and_family_read_the_first_processor(tmp_path: Path) -> None:
    """The vendor string as cpuinfo spells it and the family as a number; empty / None without
    one, without the file, or with a family that is not a number."""
    info = tmp_path / "cpuinfo"
    for vendor, family in (("GenuineIntel", 6), ("AuthenticAMD", 25), ("AuthenticAMD", 26)):
        info.write_text(_cpuinfo(vendor, family, 2, "avx2"))
        assert (cpu_vendor(str(info)), cpu_family(str(info))) == (vendor, family)
    info.write_text("processor\t: 0\nCPU implementer\t: 0x41\nCPU architecture: 8\n")  # ARM
    assert (cpu_vendor(str(info)), cpu_family(str(info))) == ("", None)
    info.write_text("vendor_id\t: AuthenticAMD\ncpu family\t: 1a\n")
    assert cpu_family(str(info)) is None
    absent = str(tmp_path / "absent")
    assert (cpu_vendor(absent), cpu_family(absent)) == ("", None)


@needs_packed
@pytest.mark.parametrize("context", ["no_grad", "inference_mode"])
def test_packed_linear_never_runs_a_stale_copy(context: str) -> None:
    """merge.py folds adapters into the weight in place (``copy_``) and restores it: a call
    after the write runs the weight as it is then (dense until packed again), never the copy
    of what it was."""
    generator = torch.Generator().manual_seed(1)
    x, weight = torch.randn(16, 64, generator=generator), torch.randn(48, 64, generator=generator)
    original = weight.clone()
    linear = PackedLinear()
    linear.pack(weight)
    before = linear(x, weight)
    manager = torch.no_grad() if context == "no_grad" else torch.inference_mode()
    with manager:
        weight.copy_(weight + torch.randn(48, 64, generator=generator))
    assert not linear.is_current(weight)
    after = linear(x, weight)
    assert not torch.allclose(after, before)
    assert torch.equal(after, _dense_onednn(x, weight, None))
    assert linear.pack(weight) and torch.equal(linear(x, weight), after)
    with manager:
        weight.copy_(original)
    assert torch.equal(linear(x, weight), before)
    assert linear.pack(weight) and torch.equal(linear(x, weight), before)
    assert len(linear) == 1


@needs_packed
def test_packed_linear_forgets_a_freed_weight_and_never_packs_inference_tensors() -> None:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(8, 32, generator=generator)
    linear = PackedLinear()
    weight = torch.randn(24, 32, generator=generator)
    linear.pack(weight)
    assert len(linear) == 1
    del weight
    gc.collect()
    assert len(linear) == 0
    with torch.inference_mode():
        frozen = torch.randn(24, 32, generator=generator)  # no version counter
    assert not linear.pack(frozen) and len(linear) == 0
    assert torch.equal(linear(x, frozen), _dense_onednn(x, frozen, None))


@needs_packed
def test_each_packed_kernel_holds_its_own_copies() -> None:
    first, second = linear_fn("packed"), linear_fn("packed")
    assert isinstance(first, PackedLinear) and first is not second
    assert linear_fn("onednn") is onednn_linear and linear_fn("blas") is F.linear


@needs_packed
def test_packed_linear_counts_the_bytes_of_its_copies() -> None:
    linear = PackedLinear()
    weights = [torch.randn(24, 32), torch.randn(40, 16)]
    assert linear.nbytes() == 0
    for weight in weights:
        linear.pack(weight)
    copies = [entry[2] for entry in linear._packed.values()]
    assert linear.nbytes() == sum(c.numel() * c.element_size() for c in copies)
    assert linear.nbytes() == sum(w.nbytes for w in weights)  # float32 again, element for element


def test_the_kernel_names_are_the_engine_configs() -> None:
    """``base_linear_kernel`` (engine config, torch-free) takes exactly these names."""
    assert BASE_LINEAR_KERNELS == LINEAR_KERNELS


def test_auto_linear_kernel_is_packed_only_for_float32_on_a_cpu() -> None:
    cpu = torch.device("cpu")
    want = "packed" if packed_available() else "blas"
    assert resolve_linear_kernel("auto", torch.float32, cpu) == want
    assert resolve_linear_kernel("auto", torch.bfloat16, cpu) == "blas"
    assert resolve_linear_kernel("auto", torch.float32, torch.device("meta")) == "blas"
    assert resolve_linear_kernel("blas", torch.float32, cpu) == "blas"


def test_unknown_or_unrunnable_linear_kernel_is_refused() -> None:
    with pytest.raises(ValueError, match="linear_kernel 'cublas' is invalid"):
        resolve_linear_kernel("cublas", torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="linear_kernel 'onednn' is invalid on meta"):
        resolve_linear_kernel("onednn", torch.float32, torch.device("meta"))
    with pytest.raises(ValueError, match="linear_kernel 'packed' is invalid on meta"):
        resolve_linear_kernel("packed", torch.float32, torch.device("meta"))
    with pytest.raises(ValueError, match=r"linear_kernel 'packed' is invalid with torch\.bfloat16"):
        resolve_linear_kernel("packed", torch.bfloat16, torch.device("cpu"))
