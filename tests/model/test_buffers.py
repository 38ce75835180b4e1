"""``zeroed``: zeros of the asked shape and dtype, writable and independent of each other, and
on the CPU not resident until written (the KV cache and adapter arena cost a server's start
nothing for the blocks and slots it has not used yet). ``serial_copy`` / ``serial_zero``: the
same writes as ``copy_`` / ``zero_``, in pieces no larger than the limit."""

from __future__ import annotations

import math
import mmap
import sys
import weakref
from pathlib import Path

import pytest
import torch
from tiny_models import vm_flags

from loraplex.model import buffers
from loraplex.model.buffers import (
    HUGE_PAGE_BYTES,
    ArenaReleases,
    arena_mapping,
    arena_tensor,
    serial_copy,
    serial_pieces,
    serial_zero,
    weight_buffer,
    zeroed,
)

CPU = torch.device("cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_zeroed_is_zeros_of_the_shape_and_dtype_and_writable(dtype: torch.dtype) -> None:
    a = zeroed((3, 5, 7), dtype=dtype, device=CPU)
    b = zeroed((3, 5, 7), dtype=dtype, device=CPU)
    assert a.shape == (3, 5, 7) and a.dtype == dtype and a.is_contiguous()
    assert torch.equal(a, torch.zeros((3, 5, 7), dtype=dtype))
    a[1, 2].fill_(3)
    assert int(a.sum()) == 3 * 7 and int(b.sum()) == 0  # two buffers, not one


def test_zeroed_of_nothing_and_off_the_cpu_are_plain_zeros() -> None:
    assert zeroed((0, 4), dtype=torch.float32, device=CPU).shape == (0, 4)
    meta = zeroed((2, 2), dtype=torch.float32, device=torch.device("meta"))
    assert meta.device.type == "meta" and meta.shape == (2, 2)


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_zeroed_pages_become_resident_only_when_written() -> None:
    size = 256 << 20
    before = _rss_bytes()
    buffer = zeroed((size // 4,), dtype=torch.float32, device=CPU)
    assert _rss_bytes() - before < size // 8  # allocated, not touched
    buffer[: size // 8].fill_(1.0)  # half of it
    grown = _rss_bytes() - before
    assert size // 4 <= grown < 3 * size // 4
    assert float(buffer[size // 8 :].abs().sum()) == 0.0  # reading the rest keeps it zero


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_zeroed_on_huge_pages_is_a_private_mapping_advised_hugepage() -> None:
    size = 8 << 20
    huge = zeroed((size // 4,), dtype=torch.float32, device=CPU, huge_pages=True)
    plain = zeroed((size // 4,), dtype=torch.float32, device=CPU)
    assert "hg" in vm_flags(huge) and "sh" not in vm_flags(huge)  # MADV_HUGEPAGE, private
    assert "hg" not in vm_flags(plain)
    assert float(huge.abs().sum()) == 0.0
    huge[: size // 8].fill_(2.0)
    assert float(huge.sum()) == 2.0 * (size // 8) and float(plain.sum()) == 0.0
    meta = zeroed((2, 2), dtype=torch.float32, device=torch.device("meta"), huge_pages=True)
    assert meta.device.type == "meta"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_buffers_of_a_huge_page_or_more_are_advised_hugepage(dtype: torch.dtype) -> None:
    rows = HUGE_PAGE_BYTES // (512 * torch.empty((), dtype=dtype).element_size())
    big = weight_buffer((rows, 512), dtype=dtype, device=CPU)
    small = weight_buffer((rows - 1, 512), dtype=dtype, device=CPU)
    assert big.shape == (rows, 512) and big.dtype == dtype and big.is_contiguous()
    assert "hg" in vm_flags(big) and "sh" not in vm_flags(big)
    assert "hg" not in vm_flags(small) and small.shape == (rows - 1, 512)
    meta = weight_buffer((rows, 512), dtype=dtype, device=torch.device("meta"))
    assert meta.device.type == "meta"


@pytest.mark.parametrize(
    ("shape", "limit"),
    [((4, 16, 944), 32768), ((4, 16, 512), 32768), ((3, 5, 7), 20), ((3, 5, 7), 6), ((2, 9), 4)],
)
def test_serial_pieces_cover_every_element_once_within_the_limit(
    shape: tuple[int, ...], limit: int
) -> None:
    count = torch.zeros(shape, dtype=torch.int64)
    pieces = serial_pieces(shape, limit)
    for index in pieces:
        count[index] += 1
        assert count[index].numel() <= max(limit, shape[-1])
    assert bool((count == 1).all())
    assert (len(pieces) == 1) == (math.prod(shape) <= limit)


@pytest.mark.parametrize("limit", [32768, 40, 6, 1])
def test_serial_copy_and_zero_write_a_strided_view_exactly(
    monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    """In pieces or whole, only the view's elements change, to the source's (or to zero)."""
    monkeypatch.setattr(buffers, "SERIAL_NUMEL", limit)
    stack = torch.randn(4, 12, 9)
    before = stack.clone()
    source = torch.randn(4, 5, 9)
    serial_copy(stack[:, 3:8], source)
    want = before.clone()
    want[:, 3:8] = source
    assert torch.equal(stack, want)
    serial_zero(stack[:, 1:4])
    want[:, 1:4] = 0
    assert torch.equal(stack, want)


def test_arena_releases_free_a_dropped_arena_by_pieces_and_never_one_in_use() -> None:
    mapping, _ = arena_mapping(4 * mmap.PAGESIZE, huge_pages=False)
    size = len(mapping)
    tensor = arena_tensor(mapping, 0, (size,), torch.uint8)
    tensor.fill_(7)
    releases = ArenaReleases()
    releases.add(mapping)
    gone = weakref.ref(mapping)
    del mapping  # the queue's alone now, but for the tensors made on it
    assert releases.step(1 << 30) == 0 and releases.pending_bytes == size  # in use
    view = tensor[:8]
    del tensor
    assert releases.step(1 << 30) == 0  # a view still reads it
    del view
    # one page (a budget rounds up to whole pages): that page reads zeros, the rest is intact
    assert releases.step(1) == mmap.PAGESIZE
    queued = releases._queued[0].mapping
    assert queued[: mmap.PAGESIZE] == bytes(mmap.PAGESIZE)
    assert queued[mmap.PAGESIZE : mmap.PAGESIZE + 4] == bytes([7] * 4)
    del queued
    assert releases.pending_bytes == size - mmap.PAGESIZE
    assert releases.drain() == size - mmap.PAGESIZE
    assert gone() is None and releases.pending_bytes == 0 and releases.step(1 << 30) == 0


def test_an_arena_still_in_use_does_not_hold_up_the_ones_after_it() -> None:
    """A tensor kept on one arena keeps that arena whole, and only it: the arenas queued after
    it are freed (queued in order, one kept one would have held every later one)."""
    releases = ArenaReleases()
    held, _ = arena_mapping(mmap.PAGESIZE, huge_pages=False)
    kept = arena_tensor(held, 0, (mmap.PAGESIZE,), torch.uint8)
    kept.fill_(3)
    releases.add(held)
    del held
    later, _ = arena_mapping(mmap.PAGESIZE, huge_pages=False)
    size = len(later)
    gone = weakref.ref(later)
    releases.add(later)
    del later
    assert releases.drain() == size and gone() is None
    assert releases.pending_bytes == len(releases._queued[0].mapping)
    assert torch.equal(kept, torch.full((mmap.PAGESIZE,), 3, dtype=torch.uint8))
    del kept
    assert releases.drain() > 0 and releases.pending_bytes == 0
