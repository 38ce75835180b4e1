"""``zeroed``: zeros of the asked shape and dtype, writable and independent of each other, and
on the CPU not resident until written (the KV cache and adapter arena cost a server's start
nothing for the blocks and slots it has not used yet)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from loraplex.model.buffers import zeroed

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
