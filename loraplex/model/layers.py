"""Building blocks whose parameter names match Hugging Face checkpoints, so loading is by name.

Parameters are allocated uninitialised: every value comes from the checkpoint, and random
initialisation of a large model would cost seconds for nothing. Weight matrices come from
``buffers.weight_buffer`` (on the CPU the large ones on huge pages: zeros the kernel maps at the
checkpoint's first write, so placing them there costs no copy and no memory until then).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from loraplex.cpuinfo import cpu_family, cpu_vendor
from loraplex.model.buffers import weight_buffer

LinearFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
# "blas": F.linear (MKL's sgemm for float32 on a CPU); "onednn": oneDNN's matmul on the dense
# weight; "packed": oneDNN's matmul on a copy of the weight in oneDNN's own blocked layout
# (PackedLinear); "auto": "packed" for float32 on a CPU where torch has it, else F.linear.
LINEAR_KERNELS = ("auto", "blas", "onednn", "packed")
# Fewer rows than this take F.linear even under "onednn": for one row MKL's matrix-vector
# product took 0.9x oneDNN's time over a large-preset layer, from 2 rows on oneDNN won (0.66-0.9x).
ONEDNN_MIN_ROWS = 2


def onednn_available() -> bool:
    """Whether this torch build can run :func:`onednn_linear`."""
    built = bool(torch.backends.mkldnn.is_available())  # type: ignore[no-untyped-call]
    return built and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def onednn_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear`` through oneDNN's matmul on the dense weight (no packed copy, so in-place
    weight updates such as a merge are seen at once). The op inductor's CPU code calls.

    NOTE: in float32 on a CPU, ``F.linear`` runs MKL's sgemm, which on AMD EPYC takes about
    twice as long for 16-1024 rows as oneDNN (docs/benchmarks/execution.md, "The base path");
    in bfloat16 ``F.linear`` already runs oneDNN. Results differ from sgemm's in summation order
    only (float32 rounding). Below ``ONEDNN_MIN_ROWS`` rows it is ``F.linear``."""
    if x.numel() < ONEDNN_MIN_ROWS * x.shape[-1]:
        return F.linear(x, weight, bias)
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return out


def packed_available() -> bool:
    """Whether this torch build can run :class:`PackedLinear`."""
    return onednn_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


# AMD families whose AVX-512 runs the packed copies at one row too (of the larger weights): from
# Zen 5 (family 26, a full 512-bit datapath), where Zen 4 (family 25) runs 512-bit ops as two
# 256-bit halves.
AMD_FULL_AVX512_FAMILY = 26
# On those, a one-row call runs the packed copy only for a weight of this many elements or more:
# the copy's call costs about 10 us more than F.linear's there, which only larger weights repay
# (one row, one thread, a Zen 5: F.linear 0.2-0.65x the packed time up to 512 x 512 and 1024 x
# 256, 0.84-0.90x at 512 x 1376, 0.95-0.97x at 1024 x 1024, 1.12x at 4096 x 256, 1.10-1.34x from
# 2048 x 1024 on; docs/benchmarks/peer.md, "AMD EPYC Turin (Zen 5) kernel choices").
ZEN5_ONE_ROW_MIN_ELEMENTS = 1024 * 1024


def _amd_full_avx512(capability: str | None, vendor: str | None, family: int | None) -> bool:
    """Whether this CPU (each read when None, vendor and family together) is an AMD one with
    AVX-512 of family 26 on."""
    name = torch.backends.cpu.get_cpu_capability() if capability is None else capability
    if vendor is None:
        vendor, family = cpu_vendor(), cpu_family()
    return (
        name.upper().startswith("AVX512")
        and vendor == "AuthenticAMD"
        and (family or 0) >= AMD_FULL_AVX512_FAMILY
    )


def packed_one_row_min_elements(
    capability: str | None = None, vendor: str | None = None, family: int | None = None
) -> int:
    """Fewest weight elements for which a one-row call runs the packed copy, where
    :func:`packed_rows` lets one-row calls run it: :data:`ZEN5_ONE_ROW_MIN_ELEMENTS` on an AMD
    Zen 5 (or later) with AVX-512, else 0 (every weight; an Intel CPU's copy ran one row of a
    1024 x 1024 weight in 0.42x ``F.linear``'s time, smaller ones were not measured there)."""
    return ZEN5_ONE_ROW_MIN_ELEMENTS if _amd_full_avx512(capability, vendor, family) else 0


def packed_rows(
    capability: str | None = None, vendor: str | None = None, family: int | None = None
) -> tuple[int, int | None]:
    """The rows (fewest, most; None: no bound) for which :class:`PackedLinear` runs a packed
    copy on this CPU, ``F.linear`` outside them (``capability``: torch's
    ``get_cpu_capability()``, ``vendor``: :func:`cpu_vendor`, ``family``: :func:`cpu_family`,
    the two read from /proc/cpuinfo when ``vendor`` is None). Three answers, each measured on
    its CPU (docs/benchmarks/peer.md):

    - AVX-512 on an Intel CPU or an AMD one of family 26 on (Zen 5), every row count: the packed
      copy ran one row in 0.42x ``F.linear``'s time on a Xeon (1024 x 1024) and prefill widths
      faster too (docs/benchmarks/execution.md, "Packed oneDNN weights"); on a Zen 5 (Turin)
      ``F.linear`` took 1.45-1.50x the packed time of the large preset's one-sequence step,
      every round ("AMD EPYC Turin (Zen 5) kernel choices"), but 0.89-0.98x on the 256-wide
      small preset, so there one row runs packed only for weights of
      :func:`packed_one_row_min_elements` or more.
    - AVX-512 on any other CPU (an AMD EPYC Zen 4, family 25, which runs 512-bit ops as two
      halves; "AMD EPYC Genoa (AVX-512) kernel choices"), 2 rows and more: ``F.linear`` ran the
      one-sequence step in 0.80x (large) and 0.91x (small) the packed time, every round, where
      the copies won from 2 rows to the 256-row prefill (``F.linear`` 1.10-1.63x).
    - Without AVX-512 (an AVX2-only AMD EPYC; "AMD EPYC (AVX2) kernel choices"), 2 to 32 rows:
      ``F.linear`` ran whole large-preset steps of one sequence in 0.72x the packed time, of 64
      sequences in 0.94x and a 4 x 64 prefill in 0.89x, where the packed copy won from 2 to 16
      sequences (0.81-0.91x) and tied at 32.

    A rule, not a measurement at start: timing the two paths per model at start (tried, branch
    ``genoaperf``) cost 0.2 s (small) to 1.5 s (large) of every start and, on a loaded machine,
    chose differently from one start to the next, and with it the float32 rounding of a step."""
    name = torch.backends.cpu.get_cpu_capability() if capability is None else capability
    if not name.upper().startswith("AVX512"):
        return (2, 32)
    if vendor is None:
        vendor, family = cpu_vendor(), cpu_family()
    if vendor == "GenuineIntel" or _amd_full_avx512(name, vendor, family):
        return (1, None)
    return (2, None)


class PackedLinear:
    """``F.linear`` through oneDNN's matmul on packed copies of the weights: each weight
    reordered once into the blocked layout oneDNN's kernel reads (what vLLM's CPU build does at
    load, ``create_onednn_mm``), where :func:`onednn_linear` has oneDNN reorder the dense
    weight's blocks again on every call. The dense weight stays the source of truth
    (checkpoints, merges, tied embeddings, LoRA). :meth:`pack` makes the copies; a call uses a
    weight's copy only while it is current (made from the weight as it is now: the weight's
    version counter has not moved since, as a merge's ``copy_`` moves it), else oneDNN's
    matmul on the dense weight, which gives the same result bit for bit from two rows on (the
    same kernel on the same values; one row: float32 rounding) and is slower. So packing may
    run on another thread while steps run, and a weight written in place runs dense until it
    is packed again. The price is a
    second copy of every packed weight (the same bytes again), held until the weight is freed.

    NOTE: results are oneDNN's (:func:`onednn_linear`'s from 2 rows), float32 rounding away
    from ``F.linear``'s. Calls of fewer rows than ``rows[0]`` or more than ``rows[1]`` (None:
    no bound) take ``F.linear`` (default :func:`packed_rows`: every row count on an Intel or
    Zen 5 AVX-512 CPU, 2 rows and more on another AVX-512 CPU, 2 to 32 rows without AVX-512),
    and so do one-row calls on a weight of fewer than ``one_row_min_elements`` elements
    (default :func:`packed_one_row_min_elements` with the default rows, else 0). A weight
    created in inference mode has no version counter and is never packed
    (docs/benchmarks/execution.md, "Packed oneDNN weights")."""

    def __init__(
        self, rows: tuple[int, int | None] | None = None, one_row_min_elements: int | None = None
    ) -> None:
        self.min_rows, self.max_rows = packed_rows() if rows is None else rows
        if self.min_rows < 1 or (self.max_rows is not None and self.max_rows < self.min_rows):
            raise ValueError(
                f"rows {(self.min_rows, self.max_rows)} is invalid; expected 1 <= fewest <= most"
            )
        if one_row_min_elements is None:
            one_row_min_elements = packed_one_row_min_elements() if rows is None else 0
        if one_row_min_elements < 0:
            raise ValueError(
                f"one_row_min_elements {one_row_min_elements} is invalid; expected >= 0"
            )
        self.one_row_min_elements = one_row_min_elements
        # id(weight) -> (the weight, weakly; its version before it was packed; the copy)
        self._packed: dict[int, tuple[weakref.ref[torch.Tensor], int, torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self._packed)

    def nbytes(self) -> int:
        """Bytes of the packed copies held (beside the dense weights' own): their elements'
        bytes (an opaque oneDNN tensor shows no storage; its blocked layout may pad a
        dimension that is no multiple of its block, a few tenths of a percent more)."""
        return sum(entry[2].nbytes for entry in self._packed.values())

    def is_current(self, weight: torch.Tensor) -> bool:
        """Whether a packed copy of ``weight`` as it is now is held."""
        entry = self._packed.get(id(weight))
        return entry is not None and entry[0]() is weight and entry[1] == weight._version

    def pack(self, weight: torch.Tensor) -> bool:
        """Make ``weight``'s packed copy unless a current one is held (an inference-mode
        weight is not packed); returns whether it made one. Safe beside calls on another
        thread: the version is read before the copy, so a write during the copy leaves it
        stale (not used) rather than wrong."""
        if weight.is_inference() or self.is_current(weight):
            return False
        key, version = id(weight), weight._version
        packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
        self._packed[key] = (weakref.ref(weight, self._forgetter(key)), version, packed)
        return True

    def _forgetter(self, key: int) -> Callable[[weakref.ref[torch.Tensor]], None]:
        def forget(_: weakref.ref[torch.Tensor]) -> None:  # the weight was freed
            entry = self._packed.get(key)
            if entry is not None and entry[0]() is None:
                del self._packed[key]

        return forget

    def __call__(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        rows = x.numel() // max(x.shape[-1], 1)
        if rows < self.min_rows or (self.max_rows is not None and rows > self.max_rows):
            return F.linear(x, weight, bias)
        if rows == 1 and weight.numel() < self.one_row_min_elements:
            return F.linear(x, weight, bias)
        entry = self._packed.get(id(weight))
        current = (
            entry is not None
            and entry[0]() is weight
            and not weight.is_inference()
            and entry[1] == weight._version
        )
        matrix = entry[2] if current and entry is not None else weight
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, matrix, bias, "none", [], "")
        return out


# "auto" makes packed copies only while they take at most this share of the machine's memory
# (``resolve_linear_kernel``): the copies sit beside the dense weights, so they double the base
# weights' memory (the large preset: +704 MiB, 3 % of a 24 GiB machine); a float32 model whose
# copies would take more runs "onednn" on its one copy unless "packed" is asked for by name.
AUTO_PACKED_MEMORY_SHARE = 1 / 8


def resolve_linear_kernel(
    name: str,
    dtype: torch.dtype,
    device: torch.device,
    *,
    packed_bytes: int = 0,
    memory_bytes: int | None = None,
) -> str:
    """``name`` (a LINEAR_KERNELS entry) as the kernel that runs: "blas", "onednn" or
    "packed". ``auto`` is "packed" for float32 on a CPU while the copies' ``packed_bytes`` are
    at most ``AUTO_PACKED_MEMORY_SHARE`` of ``memory_bytes`` (the machine's; None: unknown,
    no bound), else "onednn"."""
    if name not in LINEAR_KERNELS:
        raise ValueError(f"linear_kernel {name!r} is invalid; expected one of {LINEAR_KERNELS}")
    cpu = device.type == "cpu"
    if name == "auto":
        if not (cpu and dtype == torch.float32 and packed_available()):
            return "blas"
        fits = memory_bytes is None or packed_bytes <= memory_bytes * AUTO_PACKED_MEMORY_SHARE
        return "packed" if fits else ("onednn" if onednn_available() else "blas")
    if name == "packed" and dtype != torch.float32:
        raise ValueError(
            f"linear_kernel 'packed' is invalid with {dtype}; expected float32 (packed copies "
            "are made for float32 weights only)"
        )
    runnable = {"onednn": onednn_available, "packed": packed_available}.get(name)
    if runnable is not None and not (cpu and runnable()):
        raise ValueError(
            f"linear_kernel {name!r} is invalid on {device} (oneDNN available: "
            f"{runnable()}); expected a CPU with a torch built with oneDNN"
        )
    return name


def linear_fn(kernel: str) -> LinearFn:
    """The function running a resolved kernel ("blas", "onednn" or "packed"; a "packed" one
    holds its packed weights: one per model)."""
    if kernel == "packed":
        return PackedLinear()
    return onednn_linear if kernel == "onednn" else F.linear


class Linear(nn.Module):
    """``y = x W^T (+ b)`` with ``W`` [d_out, d_in] as stored in checkpoints."""

    def __init__(
        self, d_in: int, d_out: int, bias: bool, *, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            weight_buffer((d_out, d_in), dtype=dtype, device=device), requires_grad=False
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
            weight_buffer((vocab, hidden), dtype=dtype, device=device), requires_grad=False
        )

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(token_ids, self.weight)
