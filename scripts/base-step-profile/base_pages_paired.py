"""The base decode step with its weights on huge pages against as loaded, paired in one process
(execution.md, "The adapters' bandwidth": noticed, not changed).

``bench execution``'s float32 model of the preset loaded twice; in the second every parameter of
2 MiB or more is copied into ``buffers.zeroed(huge_pages=True)``. Base decode of 16 sequences,
rounds alternating (AB, BA), thread time. Prints one JSON line. Timed use: ``flock
/work/bench.lock nice -n -5 timeout 300 env PYTHONPATH=$PWD python
scripts/base-step-profile/base_pages_paired.py --rounds 16``.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from loraplex.bench.execution.runners import StepShape
from loraplex.model.buffers import zeroed

sys.path.insert(0, str(Path(__file__).parent))
from lora_paired import r16_setup, ratio_summary, rotated
from paired import CONTEXT, start

HUGE_PAGE = 2 << 20


def main() -> None:
    args, heap_kept, load_start = start(12)
    with tempfile.TemporaryDirectory() as tmp:
        small, _ = r16_setup(Path(tmp), args.preset)
        huge, _ = r16_setup(Path(tmp) / "b", args.preset)
        moved = 0
        with torch.no_grad():
            for param in huge.model.parameters():
                if param.numel() * param.element_size() >= HUGE_PAGE:
                    copy = zeroed(
                        tuple(param.shape), dtype=param.dtype, device=param.device, huge_pages=True
                    )
                    param.data = copy.copy_(param.data)
                    moved += param.numel() * param.element_size()
        shape = StepShape(16, 1, CONTEXT)
        steps = {"small": small.step(shape, None, None), "huge": huge.step(shape, None, None)}
        same = torch.equal(torch.as_tensor(steps["small"]()), torch.as_tensor(steps["huge"]()))
        cpu = rotated(steps, ("small", "huge"), args.rounds, args.calls)
    result = {
        "name": "base-pages-paired",
        "config": {"preset": args.preset, "rounds": args.rounds, "calls": args.calls},
        "heap_kept": heap_kept,
        "loadavg_start": load_start,
        "logits_equal": bool(same),
        "moved_mib": moved >> 20,
        "thread_ms": {k: round(statistics.median(v), 2) for k, v in cpu.items()},
        "huge/small": ratio_summary(cpu["huge"], cpu["small"]),
        "huge_faster_rounds": sum(h < s for h, s in zip(cpu["huge"], cpu["small"], strict=True)),
        "loadavg_end": Path("/proc/loadavg").read_text().split()[:3],
    }
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
