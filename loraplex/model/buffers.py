"""Large zero-filled buffers (the paged KV cache, the adapter arena) that cost nothing until used.

``torch.zeros`` writes every byte at once: for the demo's ~90 MiB of KV cache and arena that was
a few hundred milliseconds of a server's start, and the whole size resident from the start though
a cold server touches a few blocks and slots. On the CPU an anonymous mapping gives the same
zeros lazily (the kernel maps a zeroed page at its first touch); elsewhere ``torch.zeros``.

NOTE: the pages are then committed when first written, not at start-up: a machine without the
memory fails later rather than at once (as it does with any overcommitted allocation).

The model's large weights (``weight_buffer``) are such buffers on huge pages: the checkpoint's
copy is their first write, so they cost no memory before it and no copy of their own.

``serial_copy`` and ``serial_zero`` write into such buffers in pieces torch runs on the calling
thread: ATen hands a CPU op over more than ``SERIAL_NUMEL`` elements to its intra-op threads, and
for an adapter's few hundred KiB waking them costs more than the copy (measured on a busy 2-core
machine: a [4, 16, 944] zeroing took 7 us on one thread, 2.6-4 ms at P90 on two, the caller
spinning until the other thread was scheduled), and a loader thread's copy then competes with
the forward for those threads.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import sys
from functools import lru_cache

import torch

# ATen's GRAIN_SIZE: a CPU op over more elements is split across the intra-op threads
SERIAL_NUMEL = 32768
# A transparent huge page (x86-64, arm64 with 4 KiB base pages): smaller buffers cannot hold one
HUGE_PAGE_BYTES = 2 << 20


def zeroed(
    shape: tuple[int, ...], *, dtype: torch.dtype, device: torch.device, huge_pages: bool = False
) -> torch.Tensor:
    """A contiguous tensor of zeros of ``shape``, lazily zeroed by the kernel on the CPU.

    ``huge_pages``: on the CPU, a private mapping advised ``MADV_HUGEPAGE``, so the kernel backs
    it with 2 MiB pages where it can (transparent huge pages in "madvise" or "always" mode; else,
    or where the advice is refused, ordinary pages: a hint, not a requirement). A buffer read
    from end to end every step then misses the TLB 512 times less; its pages are committed 2 MiB
    at a time when first written."""
    device = torch.device(device)
    numel = math.prod(shape)
    if device.type != "cpu" or numel == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    element_bytes = torch.empty((), dtype=dtype).element_size()
    # The tensor holds the mapping alive (frombuffer keeps a reference to its buffer).
    if huge_pages:
        buffer = mmap.mmap(-1, numel * element_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        advise_huge_pages(buffer)
    else:
        buffer = mmap.mmap(-1, numel * element_bytes)
    return torch.frombuffer(buffer, dtype=dtype).view(shape)


def weight_buffer(
    shape: tuple[int, ...], *, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """Storage for a model weight, filled once at load and read whole by every step: on the CPU,
    one of ``HUGE_PAGE_BYTES`` or more is ``zeroed(huge_pages=True)`` (the large preset's base
    decode step took 0.95-0.96x the time there in float32 and bfloat16, its load 0.25-1 s more:
    docs/benchmarks/execution.md, "The base weights on huge pages"); smaller ones, and any off
    the CPU, ``torch.empty``."""
    device = torch.device(device)
    element_bytes = torch.empty((), dtype=dtype).element_size()
    if device.type == "cpu" and math.prod(shape) * element_bytes >= HUGE_PAGE_BYTES:
        return zeroed(shape, dtype=dtype, device=device, huge_pages=True)
    return torch.empty(shape, dtype=dtype, device=device)


def arena_mapping(nbytes: int, *, huge_pages: bool) -> tuple[mmap.mmap, int]:
    """A private anonymous mapping (lazily zeroed, CPU) with ``nbytes`` or more from a 2 MiB
    boundary on, and the offset of that boundary in it, for tensors made on it at offsets from
    there (:func:`arena_tensor`). ``huge_pages``: advised ``MADV_HUGEPAGE`` as :func:`zeroed`
    does, so the tensors fill whole huge pages one after the other (where buffers of their own
    sizes, a 5.5 MiB module, need not start on a boundary, and those under 2 MiB never get a
    huge page); else the kernel's default (4 KiB pages in THP "madvise" mode; aligned, so
    khugepaged or "always" mode can still back it with huge pages). Mapped 2 MiB larger than
    asked (the slack before the boundary and after the end is never touched: no memory). The
    mapping lives while any tensor made on it does (each holds a reference)."""
    size = -(-max(nbytes, 1) // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES + HUGE_PAGE_BYTES
    mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge_pages:
        advise_huge_pages(mapping)
    address = torch.frombuffer(mapping, dtype=torch.uint8, count=1).data_ptr()
    return mapping, -address % HUGE_PAGE_BYTES


def advise_huge_pages(mapping: mmap.mmap) -> None:
    """Advise ``mapping`` ``MADV_HUGEPAGE`` (a hint: pages not yet written fault in as huge
    pages, written ones may be collapsed by khugepaged later); nothing where the platform or
    kernel has no transparent huge pages."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        with contextlib.suppress(OSError):  # a kernel without transparent huge pages
            mapping.madvise(advice)


# What one step boundary frees of dropped arenas (``ArenaReleases.step``): 32 MiB, 8,192 pages
# (the large preset's 350 MiB arena freed at once took 23-37 ms on a shared 2-core Zen 4: about
# 2-3.4 ms a piece there, and its arena gone in 11 boundaries)
ARENA_RELEASE_BYTES = 32 << 20
# ``sys.getrefcount`` of a queued arena no tensor is made on: its ``_Queued``'s and the call's own
_QUEUED_REFS = 2


class _Queued:
    """An arena waiting to be freed, and how much of it is freed so far."""

    __slots__ = ("freed", "mapping")

    def __init__(self, mapping: mmap.mmap) -> None:
        self.mapping = mapping
        self.freed = 0  # bytes from its start freed so far


class ArenaReleases:
    """Arenas (:func:`arena_mapping`) whose tensors are gone, freed a bounded piece at a time.

    Freeing an arena at once, when its last tensor goes, returns every page of it in one call:
    the large preset's merged weights (about 350 MiB on 4 KiB pages) took 23-37 ms, and an
    unmerge, which drops them inside the slot lock, held the steps that long (1.2-1.4 ms when
    they were buffers of their own on huge pages; docs/modes.md, "The arena at request level").
    Held here instead, an arena is freed ``budget_bytes`` at a time by :meth:`step`, which the
    engine calls at each step boundary (``MADV_DONTNEED`` over the piece: its pages go, the
    mapping stays), then unmapped (nothing left in it). An arena is touched only once no tensor
    is made on it any more: each tensor holds a reference to the mapping (``torch.frombuffer``),
    so while the mapping has more references than this queue's, some tensor still reads it and
    it waits (a stale reference never sees its memory zeroed under it), without holding up the
    arenas queued after it.
    """

    def __init__(self) -> None:
        self._queued: list[_Queued] = []

    def add(self, mapping: mmap.mmap) -> None:
        """Free ``mapping`` by pieces once no tensor is made on it (the caller drops its own
        references to it)."""
        self._queued.append(_Queued(mapping))

    @property
    def pending_bytes(self) -> int:
        """Bytes of the arenas not yet freed (mapped; those never written hold no memory)."""
        return sum(len(q.mapping) - q.freed for q in self._queued)

    def step(self, budget_bytes: int) -> int:
        """Free up to ``budget_bytes`` (rounded up to whole pages) of the arenas no tensor uses,
        oldest first; the bytes freed (0: none pending, or every one still in use)."""
        freed = 0
        for queued in list(self._queued):
            if freed >= budget_bytes:
                break
            # a tensor made on it holds a reference beyond the queue's (and getrefcount's own)
            if sys.getrefcount(queued.mapping) > _QUEUED_REFS:
                continue
            size = len(queued.mapping)
            pages = -(-(budget_bytes - freed) // mmap.PAGESIZE)
            piece = min(size - queued.freed, pages * mmap.PAGESIZE)
            with contextlib.suppress(OSError, AttributeError):  # no madvise: unmapped whole
                queued.mapping.madvise(mmap.MADV_DONTNEED, queued.freed, piece)
            queued.freed += piece
            freed += piece
            if queued.freed >= size:
                self._queued.remove(queued)
                queued.mapping.close()
        return freed

    def drain(self) -> int:
        """Free every arena no tensor uses now (a caller with no steps to spread it over)."""
        return self.step(self.pending_bytes)


def arena_tensor(
    mapping: mmap.mmap, offset: int, shape: tuple[int, ...], dtype: torch.dtype
) -> torch.Tensor:
    """A contiguous tensor of ``shape`` on ``mapping`` from byte ``offset`` on (a multiple of the
    element size). A tensor of its own, not a view of another: its version counter is its own,
    so writing one tensor of an arena leaves the others' packed copies current
    (``layers.PackedLinear`` checks the version)."""
    return torch.frombuffer(mapping, dtype=dtype, count=math.prod(shape), offset=offset).view(shape)


def serial_copy(destination: torch.Tensor, source: torch.Tensor) -> None:
    """``destination.copy_(source)`` (same shapes); on the CPU in pieces of at most
    ``SERIAL_NUMEL`` elements, so no piece wakes torch's other threads."""
    pieces = serial_pieces_of(destination)
    if len(pieces) == 1:
        destination.copy_(source)
        return
    for index in pieces:
        destination[index].copy_(source[index])


def serial_zero(view: torch.Tensor) -> None:
    """``view.zero_()``, in pieces on the CPU as :func:`serial_copy`."""
    pieces = serial_pieces_of(view)
    if len(pieces) == 1:
        view.zero_()
        return
    for index in pieces:
        view[index].zero_()


def serial_pieces_of(tensor: torch.Tensor) -> tuple[tuple[slice, ...], ...]:
    """The indexes ``serial_copy`` and ``serial_zero`` cut ``tensor`` into (``((),)``: whole)."""
    if tensor.device.type != "cpu":
        return ((),)  # a device's copy is one kernel: no threads to wake
    return serial_pieces(tuple(tensor.shape), SERIAL_NUMEL)


@lru_cache(maxsize=256)
def serial_pieces(shape: tuple[int, ...], limit: int) -> tuple[tuple[slice, ...], ...]:
    """Index tuples cutting a tensor of ``shape`` into pieces of at most ``limit`` elements
    along its leading dimensions (``((),)``: one piece, the whole); only a last dimension
    longer than ``limit`` stays whole."""
    numel = math.prod(shape)
    if numel <= limit or len(shape) < 2:
        return ((),)
    inner = numel // shape[0]
    if inner <= limit:
        step = limit // inner
        return tuple((slice(i, i + step),) for i in range(0, shape[0], step))
    rests = serial_pieces(shape[1:], limit)
    return tuple((slice(i, i + 1), *rest) for i in range(shape[0]) for rest in rests)
