"""Large zero-filled buffers (the paged KV cache, the adapter arena) that cost nothing until used.

``torch.zeros`` writes every byte at once: for the demo's ~90 MiB of KV cache and arena that was
a few hundred milliseconds of a server's start, and the whole size resident from the start though
a cold server touches a few blocks and slots. On the CPU an anonymous mapping gives the same
zeros lazily (the kernel maps a zeroed page at its first touch); elsewhere ``torch.zeros``.

NOTE: the pages are then committed when first written, not at start-up: a machine without the
memory fails later rather than at once (as it does with any overcommitted allocation).
"""

from __future__ import annotations

import math
import mmap

import torch


def zeroed(shape: tuple[int, ...], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A contiguous tensor of zeros of ``shape``, lazily zeroed by the kernel on the CPU."""
    device = torch.device(device)
    numel = math.prod(shape)
    if device.type != "cpu" or numel == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    element_bytes = torch.empty((), dtype=dtype).element_size()
    # The tensor holds the mapping alive (frombuffer keeps a reference to its buffer).
    buffer = mmap.mmap(-1, numel * element_bytes)
    return torch.frombuffer(buffer, dtype=dtype).view(shape)
