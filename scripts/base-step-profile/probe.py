"""Where a decode step's time goes on the large preset (issue 27 item 2, execution.md "The base
path: oneDNN linears").

``bench execution``'s setup (its random base of the preset, the server's paged KV cache, 64
cached positions; with ``--r16``, 16 distinct rank-16 adapters on q/k/v/o in one ``auto``
pool), float32, one thread. For each batch size, torch.profiler over ``--steps`` steps of the
base decode (and the r16 decode): the CPU time of every op, summed into pieces (matmuls,
attention, norms/rope, LoRA ops, the rest) and the step's thread time not inside any op
(python overhead). Then, without the profiler, the linear layers' kernels alone per module
shape: ``F.linear`` (MKL's sgemm in float32) against oneDNN (``loraplex.model.layers.linear``
with the kernel forced), median thread time per call.

``--prefill`` profiles a base prefill of 4 x 64 tokens too; ``--floors`` measures this CPU's
floors for one thread (reading a 512 MiB float32 tensor: GB/s; oneDNN's matmul on packed
weights at 512 rows: GFLOP/s) and each profiled step's floors from them: the bytes of every
base weight it reads over that bandwidth, its matmuls' FLOPs over that rate.

Prints one JSON line. Untimed use: ``chrt -i 0 nice -n 19 env PYTHONPATH=$PWD python
scripts/base-step-profile/probe.py --preset large --batches 16,32 --r16``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from loraplex.bench.execution.runners import LoraplexRunner, StepShape
from loraplex.bench.execution.setup import MAX_RANK, UNIFORM_MIX, Workspace
from loraplex.engine.heap import keep_freed_heap

ADAPTERS = 16
CONTEXT = 64
# op-name fragments -> piece of the step; first match wins
PIECES = (
    ("lora", ("bmm", "index_add", "index_put")),  # the batched/grouped LoRA ops' own kernels
    ("attention", ("attention", "softmax", "_flash", "masked_fill")),
    ("matmul", ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "mkldnn", "mkl_")),
    ("norm_rope", ("rms_norm", "rsqrt", "aten::cat", "aten::neg", "aten::mul", "aten::pow")),
    ("gather_scatter", ("index_select", "index_add", "index_copy", "embedding", "gather")),
)


def piece_of(name: str) -> str:
    for piece, fragments in PIECES:
        if any(fragment in name for fragment in fragments):
            return piece
    return "other_ops"


def profiled(step: Callable[[], object], steps: int) -> dict[str, object]:
    """Time per piece (ops' self time), its share of the step, and the time outside any op
    (python), in ms per step."""
    for _ in range(3):
        step()
    started, started_cpu = time.perf_counter(), time.thread_time()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    # the profiler's op times are wall clock, so the step's is too; thread time beside it
    total_ms = (time.perf_counter() - started) * 1e3 / steps
    thread_ms = (time.thread_time() - started_cpu) * 1e3 / steps
    by_piece: dict[str, float] = defaultdict(float)
    by_op: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        self_ms = event.self_cpu_time_total / 1e3 / steps
        by_op[event.key] += self_ms
        by_piece[piece_of(event.key)] += self_ms
    in_ops = sum(by_piece.values())
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:12]
    return {
        "step_wall_ms_profiled": round(total_ms, 2),
        "step_thread_ms_profiled": round(thread_ms, 2),
        "pieces_ms": {k: round(v, 2) for k, v in sorted(by_piece.items())},
        "pieces_share": {k: round(v / total_ms, 3) for k, v in sorted(by_piece.items())},
        "outside_ops_ms": round(total_ms - in_ops, 2),
        "top_ops_ms": {k: round(v, 2) for k, v in top},
    }


def floors(model: torch.nn.Module) -> dict[str, float]:
    """One thread's read bandwidth (GB/s, a sum over 512 MiB) and oneDNN matmul rate
    (GFLOP/s, packed 2816 x 1024 weight, 512 rows), best of a few; the model's linear
    weight bytes and parameters a token multiplies by."""
    big = torch.ones(128 * 1024 * 1024)
    reads = []
    for _ in range(5):
        started = time.perf_counter()
        big.sum()
        reads.append(big.numel() * 4 / (time.perf_counter() - started) / 1e9)
    del big
    weight = torch.randn(2816, 1024)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight)
    x = torch.randn(512, 1024)
    rates = []
    for _ in range(5):
        started = time.thread_time()
        torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        rates.append(2 * 512 * 2816 * 1024 / (time.thread_time() - started) / 1e9)
    linear = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in n]
    head = model.lm_head if model.lm_head is not None else model.model.embed_tokens
    params = sum(p.numel() for p in linear) + (
        0 if model.lm_head is not None else head.weight.numel()
    )
    return {
        "read_gb_per_s": round(max(reads), 2),
        "matmul_gflop_per_s": round(max(rates), 1),
        "weight_bytes": params * 4,
        "matmul_params": params,
    }


def kernel_times(model: torch.nn.Module, batch: int, calls: int) -> dict[str, dict[str, float]]:
    """Median thread-time (us) per call of each distinct linear shape, MKL vs oneDNN."""
    from loraplex.model.layers import onednn_linear

    shapes: dict[tuple[int, int], torch.Tensor] = {}
    for name, param in model.named_parameters():
        if param.dim() == 2 and "embed" not in name:
            shapes.setdefault(tuple(param.shape), param)
    out: dict[str, dict[str, float]] = {}
    for (d_out, d_in), weight in sorted(shapes.items()):
        x = torch.randn(batch, d_in, dtype=weight.dtype)
        times: dict[str, list[float]] = {"blas": [], "onednn": []}
        fns = {
            "blas": lambda x=x, w=weight: F.linear(x, w),
            "onednn": lambda x=x, w=weight: onednn_linear(x, w),
        }
        for fn in fns.values():
            fn()
        for i in range(calls):
            order = list(fns) if i % 2 == 0 else list(reversed(fns))
            for key in order:
                started = time.thread_time_ns()
                fns[key]()
                times[key].append((time.thread_time_ns() - started) / 1e3)
        blas, onednn = (statistics.median(times[k]) for k in ("blas", "onednn"))
        out[f"{d_out}x{d_in}"] = {
            "blas_us": round(blas, 1),
            "onednn_us": round(onednn, 1),
            "onednn_over_blas": round(onednn / blas, 3),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="large")
    parser.add_argument("--batches", default="16,32")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--r16", action="store_true")
    parser.add_argument("--kernel", default="auto", help="the model's linear_kernel")
    parser.add_argument("--prefill", action="store_true", help="profile a 4 x 64 prefill too")
    parser.add_argument("--floors", action="store_true", help="measure and report floors")
    parser.add_argument("--no-kernels", action="store_true", help="skip the kernel table")
    args = parser.parse_args()
    torch.set_num_threads(1)
    keep_freed_heap()
    batches = [int(b) for b in args.batches.split(",")]
    result: dict[str, object] = {"name": "base-step-profile", "preset": args.preset}
    with tempfile.TemporaryDirectory() as tmp:
        mixes = (UNIFORM_MIX,) if args.r16 else ()
        space = Workspace.create(Path(tmp), args.preset, ADAPTERS, 0, mixes)
        runner = LoraplexRunner(
            space.model_dir, torch.float32, max(batches), CONTEXT + 64, linear_kernel=args.kernel
        )
        result["linear_kernel"] = runner.model.linear_kernel
        pool = None
        if args.r16:
            weights = [runner.weights(d, MAX_RANK) for d in space.adapters[UNIFORM_MIX]]
            pool = runner.pool(weights, "auto", MAX_RANK)
        for batch in batches:
            shape = StepShape(batch, 1, CONTEXT)
            result[f"base_b{batch}"] = profiled(runner.step(shape, None, None), args.steps)
            if pool is not None:
                slots = [i % ADAPTERS for i in range(batch)]
                result[f"r16_b{batch}"] = profiled(runner.step(shape, slots, pool), args.steps)
            if not args.no_kernels:
                result[f"kernels_b{batch}"] = kernel_times(runner.model, batch, 20)
        if args.prefill:
            result["prefill_4x64"] = profiled(runner.step(StepShape(4, 64, CONTEXT), None, None), 2)
        if args.floors:
            found = floors(runner.model)
            result["floors"] = found
            tokens = {f"base_b{b}": b for b in batches} | (
                {"prefill_4x64": 256} if args.prefill else {}
            )
            for name, count in tokens.items():
                flop_ms = 2 * found["matmul_params"] * count / found["matmul_gflop_per_s"] / 1e6
                bytes_ms = found["weight_bytes"] / found["read_gb_per_s"] / 1e6
                result[name]["floor_ms"] = {
                    "weight_bytes": round(bytes_ms, 2),
                    "matmul_flops": round(flop_ms, 2),
                }
    result["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
