"""Ways to read the r16 step's adapter arenas, swept cold, paired in one process (issue 27 item 2;
execution.md, "The adapters' bandwidth").

The large preset's attention shapes (hidden 1024, k/v 256 wide, 16 layers), 16 slots of rank 16
on q/k/v/o, one decode token per slot: the batched op's work for one step, 64 (layer, module)
calls, 104 MiB of A and B^T rows in float32. Every variant holds its own copy of the same
weights (bfloat16 ones rounded from them) and sweeps the 64 modules after 256 MiB of other
memory has been written (the arenas come from memory, as in a step):

- ``rows``: the pool's layout (one stack per module, a row = its A row then its B^T row, a
  lazily zeroed shared mapping) and the batched op's kernels, ``bmm`` then ``baddbmm_``;
- ``huge``: the same in a private mapping advised ``MADV_HUGEPAGE`` (2 MiB pages, fewer TLB
  misses);
- ``split``: A rows and B^T rows in separate stacks (each block's A contiguous);
- ``slot_t``: per slot, its A stored ``[d_in, rank]`` and its B ``[d_out, rank]`` in its rows'
  region, so each kernel reads one block as one stream;
- ``qkv``: q/k/v's A side by side per slot, one shrink for the three (one launch and one read
  of x instead of three), three expands on column slices of its result (their B^T as ``rows``);
- ``bf16_up``: bfloat16 stacks (half the bytes), each block converted to float32 per call;
- ``bf16_mm``: bfloat16 stacks and bfloat16 kernels (x rounded; the delta added in float32);
- ``touch``: each module's rows summed first (read at streaming speed), then ``rows``' kernels
  on them from cache;
- ``floor``: only that sum over the same bytes: what streaming them costs.

Rounds rotate the order (forwards, backwards); per round and variant the median thread time of
3 sweeps. Reports per variant the median ms, the per-round ratio to ``rows`` (median, min-max)
and the largest difference of its result from ``rows``' relative to its largest value.

Prints one JSON line. Timed use: ``flock /work/bench.lock nice -n -5 timeout 600 env
PYTHONPATH=$PWD python scripts/base-step-profile/arena_bandwidth.py --rounds 8``.
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

LAYERS, SLOTS, RANK, HIDDEN = 16, 16, 16, 1024
WIDE = {"q": 1024, "k": 256, "v": 256, "o": 1024}  # d_out per module; d_in is HIDDEN
CAPACITY = SLOTS * RANK
Pair = tuple[torch.Tensor, torch.Tensor]  # one module's (A.T blocks, B^T blocks)
Sweep = Callable[[torch.Tensor, dict[str, torch.Tensor]], None]


def mapped(shape: tuple[int, ...], dtype: torch.dtype, huge: bool = False) -> torch.Tensor:
    """Zeros in an anonymous mapping: shared as the pool's (``buffers.zeroed``), or private and
    advised to use huge pages."""
    size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if not huge:
        return torch.frombuffer(mmap.mmap(-1, size), dtype=dtype).view(shape)
    buffer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buffer.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(buffer, dtype=dtype).view(shape)


def row_stacks(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], **kw: object
) -> list[dict[str, Pair]]:
    """Per layer and module the block views of the pool's layout (A row | B^T row)."""
    layers: list[dict[str, Pair]] = [{} for _ in range(LAYERS)]
    for m, d_out in WIDE.items():
        stack = mapped((LAYERS, CAPACITY, HIDDEN + d_out), **kw)  # type: ignore[arg-type]
        stack[:, :, :HIDDEN] = a[m]
        stack[:, :, HIDDEN:] = b[m]
        for layer in range(LAYERS):
            lora_a = stack[layer, :, :HIDDEN].view(SLOTS, RANK, HIDDEN).transpose(1, 2)
            layers[layer][m] = (lora_a, stack[layer, :, HIDDEN:].view(SLOTS, RANK, d_out))
    return layers


def split_stacks(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[dict[str, Pair]]:
    layers: list[dict[str, Pair]] = [{} for _ in range(LAYERS)]
    for m, d_out in WIDE.items():
        sa, sb = (
            mapped((LAYERS, CAPACITY, HIDDEN), torch.float32),
            mapped((LAYERS, CAPACITY, d_out), torch.float32),
        )
        sa.copy_(a[m])
        sb.copy_(b[m])
        for layer in range(LAYERS):
            blocks = sa[layer].view(SLOTS, RANK, HIDDEN).transpose(1, 2)
            layers[layer][m] = (blocks, sb[layer].view(SLOTS, RANK, d_out))
    return layers


def slot_transposed(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]
) -> list[dict[str, Pair]]:
    layers: list[dict[str, Pair]] = [{} for _ in range(LAYERS)]
    for m, d_out in WIDE.items():
        region = mapped((LAYERS, SLOTS, RANK * (HIDDEN + d_out)), torch.float32)
        for layer in range(LAYERS):
            at = region[layer, :, : RANK * HIDDEN].view(SLOTS, HIDDEN, RANK)
            bn = region[layer, :, RANK * HIDDEN :].view(SLOTS, d_out, RANK)
            at.copy_(a[m][layer].view(SLOTS, RANK, HIDDEN).transpose(1, 2))
            bn.copy_(b[m][layer].view(SLOTS, RANK, d_out).transpose(1, 2))
            layers[layer][m] = (at, bn.transpose(1, 2))
    return layers


def pairs_sweep(layers: list[dict[str, Pair]], dtype: torch.dtype = torch.float32) -> Sweep:
    def sweep(x: torch.Tensor, outs: dict[str, torch.Tensor]) -> None:
        for modules in layers:
            for m, (lora_a, lora_b) in modules.items():
                if dtype == torch.float32:
                    outs[m].baddbmm_(torch.bmm(x, lora_a), lora_b, alpha=2.0)
                else:
                    hidden = torch.bmm(x, lora_a.float())
                    outs[m].baddbmm_(hidden, lora_b.float(), alpha=2.0)

    return sweep


def bf16_sweep(layers: list[dict[str, Pair]]) -> Sweep:
    def sweep(x: torch.Tensor, outs: dict[str, torch.Tensor]) -> None:
        low = x.to(torch.bfloat16)
        for modules in layers:
            for m, (lora_a, lora_b) in modules.items():
                outs[m].add_(torch.bmm(torch.bmm(low, lora_a), lora_b), alpha=2.0)

    return sweep


def qkv_sweep(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], rows: list[dict[str, Pair]]
) -> Sweep:
    """q/k/v's A side by side per slot (``[slot, module, rank, d_in]``): one shrink for the
    three; each module's columns of the hidden are a strided view the expand reads in place."""
    fused = mapped((LAYERS, SLOTS, 3, RANK, HIDDEN), torch.float32)
    for i, m in enumerate("qkv"):
        fused[:, :, i] = a[m].view(LAYERS, SLOTS, RANK, HIDDEN)
    shrinks = [
        fused[layer].view(SLOTS, 3 * RANK, HIDDEN).transpose(1, 2) for layer in range(LAYERS)
    ]

    def sweep(x: torch.Tensor, outs: dict[str, torch.Tensor]) -> None:
        for layer in range(LAYERS):
            hidden = torch.bmm(x, shrinks[layer])
            for i, m in enumerate("qkv"):
                lora_b = rows[layer][m][1]
                outs[m].baddbmm_(hidden[:, :, i * RANK : (i + 1) * RANK], lora_b, alpha=2.0)
            lora_a, lora_b = rows[layer]["o"]
            outs["o"].baddbmm_(torch.bmm(x, lora_a), lora_b, alpha=2.0)

    return sweep


def slabs_of(layers: list[dict[str, Pair]]) -> list[torch.Tensor]:
    """Each (layer, module)'s rows as one contiguous slab (the pool layout's base storage)."""
    slabs = []
    for modules in layers:
        for lora_a, lora_b in modules.values():
            width = HIDDEN + lora_b.shape[2]
            base = lora_a.storage_offset()
            slabs.append(torch.as_strided(lora_a, (CAPACITY * width,), (1,), base))
    return slabs


def touch_sweep(layers: list[dict[str, Pair]]) -> Sweep:
    slabs = slabs_of(layers)
    pairs = [(m, pair) for modules in layers for m, pair in modules.items()]

    def sweep(x: torch.Tensor, outs: dict[str, torch.Tensor]) -> None:
        for slab, (m, (lora_a, lora_b)) in zip(slabs, pairs, strict=True):
            slab.sum()
            outs[m].baddbmm_(torch.bmm(x, lora_a), lora_b, alpha=2.0)

    return sweep


def floor_sweep(layers: list[dict[str, Pair]]) -> Sweep:
    slabs = slabs_of(layers)

    def sweep(x: torch.Tensor, outs: dict[str, torch.Tensor]) -> None:
        for slab in slabs:
            slab.sum()

    return sweep


def variants() -> dict[str, Sweep]:
    g = torch.Generator().manual_seed(0)
    a = {m: torch.randn(LAYERS, CAPACITY, HIDDEN, generator=g) * 0.01 for m in WIDE}
    b = {m: torch.randn(LAYERS, CAPACITY, d, generator=g) * 0.01 for m, d in WIDE.items()}
    rows = row_stacks(a, b, dtype=torch.float32)
    low = row_stacks(a, b, dtype=torch.bfloat16)
    return {
        "rows": pairs_sweep(rows),
        "huge": pairs_sweep(row_stacks(a, b, dtype=torch.float32, huge=True)),
        "split": pairs_sweep(split_stacks(a, b)),
        "slot_t": pairs_sweep(slot_transposed(a, b)),
        "qkv": qkv_sweep(a, b, rows),
        "bf16_up": pairs_sweep(low, torch.bfloat16),
        "bf16_mm": bf16_sweep(low),
        "touch": touch_sweep(rows),
        "floor": floor_sweep(rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_start = Path("/proc/loadavg").read_text().split()[:3]
    sweeps = variants()
    x = torch.randn(SLOTS, 1, HIDDEN)
    outs = {m: torch.zeros(SLOTS, 1, d) for m, d in WIDE.items()}
    results: dict[str, torch.Tensor] = {}
    for name, sweep in sweeps.items():
        for out in outs.values():
            out.zero_()
        sweep(x, outs)
        results[name] = torch.cat([out.flatten() for out in outs.values()])
    scale = results["rows"].abs().max()
    evict = torch.zeros(64 << 20)  # 256 MiB, more than any cache
    names = list(sweeps)
    ms: dict[str, list[float]] = {name: [] for name in names}
    for i in range(args.rounds):
        for name in names if i % 2 == 0 else reversed(names):
            times = []
            for _ in range(3):
                evict.add_(1.0)
                started = time.thread_time()
                sweeps[name](x, outs)
                times.append((time.thread_time() - started) * 1e3)
            ms[name].append(statistics.median(times))
    report = {}
    for name in names:
        ratios = [t / r for t, r in zip(ms[name], ms["rows"], strict=True)]
        report[name] = {
            "ms": round(statistics.median(ms[name]), 3),
            "over_rows": {
                "median": round(statistics.median(ratios), 3),
                "min": round(min(ratios), 3),
                "max": round(max(ratios), 3),
            },
            "rel_diff": None
            if name == "floor"
            else float((results[name] - results["rows"]).abs().max() / scale),
        }
    result = {
        "name": "arena-bandwidth",
        "config": {"rounds": args.rounds, "layers": LAYERS, "slots": SLOTS, "rank": RANK},
        "mib": round(sum(CAPACITY * (HIDDEN + d) * 4 * LAYERS for d in WIDE.values()) / 2**20, 1),
        "loadavg_start": load_start,
        "variants": report,
        "loadavg_end": Path("/proc/loadavg").read_text().split()[:3],
    }
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
