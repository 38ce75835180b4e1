"""The r16 decode step with its arenas on huge pages against ordinary pages, paired in one
process (issue 27 item 2; execution.md, "The adapters' bandwidth").

``bench execution``'s setup as ``paired.py`` (random base of the preset, paged KV cache, 64
cached positions, 16 distinct rank-16 adapters on q/k/v/o), float32, one thread, ``auto``. Two
pools of the same adapters on the same model: ``r16_small``, its arenas in ordinary pages (the
pool's allocation: a shared mapping, 4 KiB pages), and ``r16_huge``, its arenas in a private
mapping advised ``MADV_HUGEPAGE`` (``buffers.zeroed(huge_pages=True)``). Three steps of 16 decode
sequences: ``base``, ``r16_small``, ``r16_huge``; rounds rotate the order (ABC, CBA), each side
``calls`` steps a round after a warm-up; per round thread CPU time. Reports medians per step
and per round base / r16 for both pools (``mixed_r16_over_base``'s form) and r16_huge /
r16_small, the logits' equality and how much of the process is on huge pages.

Prints one JSON line. Timed use: ``flock /work/bench.lock nice -n -5 timeout 600 env
PYTHONPATH=$PWD python scripts/base-step-profile/arena_pages_paired.py --rounds 16``.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path
from unittest import mock

import torch

from loraplex.bench.execution.runners import StepShape
from loraplex.bench.execution.setup import MAX_RANK
from loraplex.model import buffers, lora_arena

sys.path.insert(0, str(Path(__file__).parent))
from lora_paired import r16_setup, ratio_summary, rotated
from paired import ADAPTERS, CONTEXT, start

sys.path.insert(0, str(Path(__file__).parents[2] / "tests" / "model"))
from tiny_models import vm_flags

SIDES = ("base", "r16_small", "r16_huge")


def huge_pages_kib() -> int:
    """AnonHugePages of this process (its anonymous memory on huge pages)."""
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return -1


def huge_pages(shape: tuple[int, ...], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``buffers.zeroed`` on huge pages (the pool allocates its arenas with ordinary pages)."""
    return buffers.zeroed(shape, dtype=dtype, device=device, huge_pages=True)


def main() -> None:
    args, heap_kept, load_start = start(16)
    with tempfile.TemporaryDirectory() as tmp:
        runner, weights = r16_setup(Path(tmp), args.preset)
        before = huge_pages_kib()
        pool_small = runner.pool(weights, "auto", MAX_RANK)
        with mock.patch.object(lora_arena, "zeroed", huge_pages):
            pool_huge = runner.pool(weights, "auto", MAX_RANK)
        flags = {
            name: sorted(vm_flags(pool._store.stacks["q_proj"]))
            for name, pool in (("small", pool_small), ("huge", pool_huge))
        }
        shape = StepShape(16, 1, CONTEXT)
        slots = [i % ADAPTERS for i in range(16)]
        steps = {
            "base": runner.step(shape, None, None),
            "r16_small": runner.step(shape, slots, pool_small),
            "r16_huge": runner.step(shape, slots, pool_huge),
        }
        logits = {name: torch.as_tensor(step()) for name, step in steps.items()}
        same = bool(torch.equal(logits["r16_small"], logits["r16_huge"]))
        cpu = rotated(steps, SIDES, args.rounds, args.calls)
        after = huge_pages_kib()
    result = {
        "name": "arena-pages-paired",
        "config": {"preset": args.preset, "rounds": args.rounds, "calls": args.calls},
        "heap_kept": heap_kept,
        "loadavg_start": load_start,
        "r16_logits_equal": same,
        "q_arena_vm_flags": flags,
        "anon_huge_pages_kib": {"before_pools": before, "after": after},
        "thread_ms": {name: round(statistics.median(cpu[name]), 2) for name in SIDES},
        "base/r16_small": ratio_summary(cpu["base"], cpu["r16_small"]),
        "base/r16_huge": ratio_summary(cpu["base"], cpu["r16_huge"]),
        "r16_huge/r16_small": ratio_summary(cpu["r16_huge"], cpu["r16_small"]),
        "huge_faster_rounds": sum(
            h < s for h, s in zip(cpu["r16_huge"], cpu["r16_small"], strict=True)
        ),
        "loadavg_end": Path("/proc/loadavg").read_text().split()[:3],
    }
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
