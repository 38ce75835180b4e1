"""The base decode step with its weights on huge pages against 4 KiB pages, paired in one process
(execution.md, "The adapters' bandwidth" and "The base weights on huge pages").

``bench execution``'s random base of the preset, in ``--dtype`` (float32 by default), loaded
twice; ``load_checkpoint`` places every weight of ``buffers.HUGE_PAGE_BYTES`` or more on huge
pages (``buffers.weight_buffer``), so the "small" side copies those into ``torch.empty`` (the C
heap's 4 KiB pages) and the "huge" side is the model as loaded. The first tensor's VmFlags are
reported for each side (``hg``: advised huge pages). Base decode of 16 sequences, rounds
alternating (AB, BA), thread time. Prints one JSON line. Timed use: ``flock /work/bench.lock
nice -n -5 timeout 300 env PYTHONPATH=$PWD python scripts/base-step-profile/base_pages_paired.py
--rounds 16``.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from loraplex.bench.execution.runners import LoraplexRunner, StepShape
from loraplex.bench.execution.setup import Workspace
from loraplex.model.buffers import HUGE_PAGE_BYTES

sys.path.insert(0, str(Path(__file__).parent))
from lora_paired import ratio_summary, rotated
from paired import CONTEXT, start

sys.path.insert(0, str(Path(__file__).parents[2] / "tests" / "model"))
from tiny_models import vm_flags


def main() -> None:
    args, heap_kept, load_start = start(12, dtype=True)
    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory() as tmp:
        space = Workspace.create(Path(tmp), args.preset, 0, 0, ())
        small, huge = (LoraplexRunner(space.model_dir, dtype, 32, CONTEXT + 64) for _ in "ab")
        moved = 0
        with torch.no_grad():
            for param in small.model.parameters():
                if param.numel() * param.element_size() >= HUGE_PAGE_BYTES:
                    param.data = torch.empty_like(param.data).copy_(param.data)
                    moved += param.numel() * param.element_size()
        first = {k: next(m.model.parameters()) for k, m in (("small", small), ("huge", huge))}
        shape = StepShape(16, 1, CONTEXT)
        steps = {"small": small.step(shape, None, None), "huge": huge.step(shape, None, None)}
        same = torch.equal(torch.as_tensor(steps["small"]()), torch.as_tensor(steps["huge"]()))
        cpu = rotated(steps, ("small", "huge"), args.rounds, args.calls)
    result = {
        "name": "base-pages-paired",
        "config": {
            "preset": args.preset,
            "dtype": args.dtype,
            "rounds": args.rounds,
            "calls": args.calls,
        },
        "heap_kept": heap_kept,
        "loadavg_start": load_start,
        "logits_equal": bool(same),
        "moved_mib": moved >> 20,
        "embed_vm_flags": {k: sorted(vm_flags(p)) for k, p in first.items()},
        "thread_ms": {k: round(statistics.median(v), 2) for k, v in cpu.items()},
        "huge/small": ratio_summary(cpu["huge"], cpu["small"]),
        "huge_faster_rounds": sum(h < s for h, s in zip(cpu["huge"], cpu["small"], strict=True)),
        "loadavg_end": Path("/proc/loadavg").read_text().split()[:3],
    }
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
