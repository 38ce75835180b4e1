"""The engine process keeps the memory its steps free, instead of handing it back to the kernel.

With glibc's defaults a block above the mmap threshold (128 KiB, raised only to the largest
block freed so far) is mapped for each allocation and unmapped when freed, and free memory at
the top of a heap above the trim threshold goes back to the kernel. An engine step allocates and
frees the same large activations every step (a 512-token prefill on the small preset: some
5,000 pages), so every step faulted them in again, each page zeroed by the kernel: measured in a
real server (docs/benchmarks/base-path.md), a fifth of a large prefill step's CPU and a few
percent of a decode step's (the server's tokens/s did not move measurably). Fixed thresholds
(``mallopt``, which also turns the dynamic adjustment off) keep such blocks in the heap: the
process's resident memory stays near its peak instead of shrinking between steps (the peak
itself did not move measurably). vLLM's CPU docs reach the same end by preloading tcmalloc;
this needs no preload and nothing installed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

_log = logging.getLogger(__name__)

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Blocks up to this size come from the heap (glibc's largest allowed value on 64-bit);
# larger ones (the KV cache, weights: allocated once) are still mapped on their own.
MMAP_THRESHOLD_BYTES = 32 << 20
# Free memory at the top of a heap is handed back only beyond this.
TRIM_THRESHOLD_BYTES = 1 << 30


def keep_freed_heap() -> bool:
    """Sets glibc's mmap and trim thresholds (above) for this process; False where the C library
    has no ``mallopt`` (not glibc) or refuses a value, and then nothing changes."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    kept = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1)
    kept = kept and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1)
    if not kept:
        _log.info("the C library refused fixed malloc thresholds; it keeps its defaults")
    return kept
