"""Whole steps, linear kernels paired in one process: by default oneDNN linears against
F.linear (MKL's sgemm in float32), ``--kernels onednn,packed`` oneDNN on the dense weight against
oneDNN on packed weights (issue 27 item 2; execution.md, "The base path: oneDNN linears" and
"Packed oneDNN weights"); ``--kernels packed,blas,onednn`` three at once, each against the first.

``bench execution``'s setup (its random base of the preset, the server's paged KV cache, 64
cached positions, 16 distinct rank-16 adapters on q/k/v/o in one ``auto`` pool shared by every
side), float32, one thread; the same checkpoint loaded once per kernel (``--kernels A,B[,C]``).
Steps (``--steps``, default the first five): base decode of 16, 32 and 64 sequences, the r16
decode of 16, a base prefill of 4 x 64 tokens; also base decode of 1, 2, 4 and 8 sequences and a
base prefill of 8 x 64 (``base_b1``, ``base_b2``, ``base_b4``, ``base_b8``, ``prefill_8x64``).
A side may name its dtype, ``KERNEL@DTYPE`` (``blas@bfloat16``: the same checkpoint loaded in
bfloat16; default float32); each side's LoRA pool is its own dtype's. Their logits
are compared first (each kernel against the first). Rounds alternate order (ABBA; A B C, C B
A with three), each side ``calls`` steps a round after warm-up; per round thread CPU time and
wall clock. Reports medians per step and per other kernel the per-round paired ratio B / A
(below 1 = B faster) with its min-max and win count.

Prints one JSON line. Timed use, under the benchmark lock: ``flock /work/bench.lock nice -n -5
env PYTHONPATH=$PWD python scripts/base-step-profile/paired.py --preset large --rounds 12``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from loraplex.bench.execution.runners import LoraplexRunner, StepShape
from loraplex.bench.execution.setup import MAX_RANK, UNIFORM_MIX, Workspace
from loraplex.dtypes import torch_dtype
from loraplex.engine.heap import keep_freed_heap

ADAPTERS = 16
CONTEXT = 64
STEPS = {  # name -> (shape, LoRA or not)
    "base_b16": (StepShape(16, 1, CONTEXT), False),
    "base_b32": (StepShape(32, 1, CONTEXT), False),
    "base_b64": (StepShape(64, 1, CONTEXT), False),
    "r16_b16": (StepShape(16, 1, CONTEXT), True),
    "prefill_4x64": (StepShape(4, 64, CONTEXT), False),
    "base_b1": (StepShape(1, 1, CONTEXT), False),
    "base_b2": (StepShape(2, 1, CONTEXT), False),
    "base_b4": (StepShape(4, 1, CONTEXT), False),
    "base_b8": (StepShape(8, 1, CONTEXT), False),
    "prefill_8x64": (StepShape(8, 64, CONTEXT), False),
}
DEFAULT_STEPS = "base_b16,base_b32,base_b64,r16_b16,prefill_4x64"


def timed(step: Callable[[], object], calls: int) -> tuple[float, float]:
    """Thread and wall ms per call over ``calls`` calls."""
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(calls):
        step()
    return ((time.thread_time() - cpu) * 1e3 / calls, (time.perf_counter() - wall) * 1e3 / calls)


def summary(times: dict[str, list[float]], a: str, *others: str) -> dict[str, object]:
    """Medians of ``a`` and of each of ``others``, and each other's per-round ratio over ``a``."""
    out: dict[str, object] = {f"{a}_ms": round(statistics.median(times[a]), 2)}
    for b in others:
        ratios = [y / x for x, y in zip(times[a], times[b], strict=True)]
        out[f"{b}_ms"] = round(statistics.median(times[b]), 2)
        out[f"{b}/{a}"] = {
            "median": round(statistics.median(ratios), 4),
            "min": round(min(ratios), 4),
            "max": round(max(ratios), 4),
            f"{b}_faster_rounds": sum(r < 1 for r in ratios),
            "rounds": len(ratios),
        }
    return out


def start(
    rounds: int, *, dtype: bool = False, kernels: bool = False, batch: bool = False
) -> tuple[argparse.Namespace, bool, list[str]]:
    """The paired probes' arguments (``rounds``: the default; ``dtype``: the probe takes
    ``--dtype``; ``kernels``: ``--kernels A,B``; ``batch``: ``--batch N``, decode sequences a
    step), one thread, the freed heap kept; returns the arguments, whether the heap is kept, and
    the load average now."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="large")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--calls", type=int, default=3)
    if dtype:
        parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    if kernels:
        parser.add_argument("--kernels", default="blas,onednn", help="A,B[,C]: linear_kernel names")
        parser.add_argument("--steps", default=DEFAULT_STEPS, help=f"of {','.join(STEPS)}")
    if batch:
        parser.add_argument("--batch", type=int, default=16, help="decode sequences a step (1-32)")
    args = parser.parse_args()
    if batch and not 1 <= args.batch <= 32:
        parser.error(f"--batch must be 1-32, got {args.batch}")
    torch.set_num_threads(1)
    heap_kept = keep_freed_heap()
    return args, heap_kept, Path("/proc/loadavg").read_text().split()[:3]


def side_runner(model_dir: Path, side: str) -> LoraplexRunner:
    """The runner of one ``--kernels`` side, ``KERNEL`` or ``KERNEL@DTYPE``."""
    kernel, _, dtype = side.partition("@")
    return LoraplexRunner(
        model_dir, torch_dtype(dtype or "float32"), 64, CONTEXT + 64, linear_kernel=kernel
    )


def side_name(side: str, runner: LoraplexRunner) -> str:
    """The kernel that ran a side (``auto`` resolved), with its dtype where the side named one."""
    kernel = runner.model.linear_kernel
    return f"{kernel}@{side.partition('@')[2]}" if "@" in side else kernel


def main() -> None:
    args, heap_kept, load_start = start(12, kernels=True)
    kernels = tuple(args.kernels.split(","))
    a, others = kernels[0], kernels[1:]
    names = args.steps.split(",")
    if len(set(kernels)) != len(kernels) or len(kernels) < 2 or not set(names) <= set(STEPS):
        raise SystemExit(f"--kernels {args.kernels!r} / --steps {args.steps!r}: see --help")
    with tempfile.TemporaryDirectory() as tmp:
        space = Workspace.create(Path(tmp), args.preset, ADAPTERS, 0, (UNIFORM_MIX,))
        runners = {k: side_runner(space.model_dir, k) for k in kernels}
        pools = {}
        for k, runner in runners.items():
            weights = [runner.weights(d, MAX_RANK) for d in space.adapters[UNIFORM_MIX]]
            pools[k] = runner.pool(weights, "auto", MAX_RANK)
        steps: dict[str, dict[str, Callable[[], object]]] = {}
        logits_rel_diff: dict[str, float] = {}
        for name in names:
            shape, lora = STEPS[name]
            slots = [i % ADAPTERS for i in range(shape.batch_size)] if lora else None
            steps[name] = {
                k: r.step(shape, slots, pools[k] if lora else None) for k, r in runners.items()
            }
            out = {k: torch.as_tensor(step()).float() for k, step in steps[name].items()}
            diffs = [(out[b] - out[a]).abs().max() / out[a].abs().max() for b in others]
            logits_rel_diff[name] = float(max(diffs))
        cpu: dict[str, dict[str, list[float]]] = {n: {k: [] for k in kernels} for n in names}
        wall: dict[str, dict[str, list[float]]] = {n: {k: [] for k in kernels} for n in names}
        for i in range(args.rounds):
            for name, sides in steps.items():
                for kernel in kernels if i % 2 == 0 else reversed(kernels):
                    sides[kernel]()  # warm-up after the other side ran
                    thread_ms, wall_ms = timed(sides[kernel], args.calls)
                    cpu[name][kernel].append(thread_ms)
                    wall[name][kernel].append(wall_ms)
    result = {
        "name": "linear-kernel-paired",
        "config": {
            "preset": args.preset,
            "rounds": args.rounds,
            "calls": args.calls,
            "kernels": [side_name(k, runners[k]) for k in kernels],
            "steps": names,
        },
        "heap_kept": heap_kept,
        "loadavg_start": load_start,
        "logits_max_rel_diff": logits_rel_diff,
        "thread": {n: summary(cpu[n], a, *others) for n in names},
        "wall": {n: summary(wall[n], a, *others) for n in names},
        "loadavg_end": Path("/proc/loadavg").read_text().split()[:3],
    }
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
