"""The adapters' cost in a large-preset decode step, and the prepared-metadata reuse, paired in
one process (issue 27 item 2; execution.md, "The adapters' cost on the large preset").

``bench execution``'s setup as ``paired.py`` (random base of the preset, paged KV cache, 64
cached positions, 16 distinct rank-16 adapters on q/k/v/o in one ``auto`` pool), float32, one
thread, the model's default linear kernel. Three steps of ``--batch`` decode sequences (default
16, at most 32, sequence i on adapter i mod 16): ``base``; ``r16_rebuilt``, the r16 step with
the pool's kept metadata dropped before every call (each step builds its plan, as before the
reuse); ``r16``, the r16 step as it runs now (consecutive steps of one batch reuse it). Rounds
rotate the order (ABC, CBA), each side ``calls`` steps a round after a warm-up; per round thread
CPU time. Reports medians per step, per round the ratios base / r16 (``mixed_r16_over_base``'s
form) for both r16 sides and r16 / r16_rebuilt.

Then, untimed against the others, a breakdown of both r16 steps: thread time per step inside
``prepare`` and inside each module's ``apply``, and the same applies swept over every
(layer, module) outside a step, once after evicting the caches ("cold": every arena read from
memory) and once on layer 0 only ("hot": its arenas in cache), which separates the kernels'
memory traffic from the per-call cost.

Prints one JSON line. Timed use: ``flock /work/bench.lock nice -n -5 timeout 600 env
PYTHONPATH=$PWD python scripts/base-step-profile/lora_paired.py --rounds 8``.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch

from loraplex.bench.execution.runners import LoraplexRunner, StepShape
from loraplex.bench.execution.setup import MAX_RANK, UNIFORM_MIX, Workspace
from loraplex.model.adapter_weights import AdapterWeights
from loraplex.model.lora import LoraSlotPool

sys.path.insert(0, str(Path(__file__).parent))
from paired import ADAPTERS, CONTEXT, start, timed

SIDES = ("base", "r16_rebuilt", "r16")
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def rebuilt(pool: LoraSlotPool, step: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        pool._prepared = None  # probe only: the step builds its metadata as before the reuse
        return step()

    return run


def r16_setup(tmp: Path, preset: str) -> tuple[LoraplexRunner, list[AdapterWeights]]:
    """``bench execution``'s float32 model of ``preset`` (in ``tmp``) and its 16 rank-16
    adapters' L1 copies."""
    space = Workspace.create(tmp, preset, ADAPTERS, 0, (UNIFORM_MIX,))
    runner = LoraplexRunner(space.model_dir, torch.float32, 32, CONTEXT + 64)
    return runner, [runner.weights(d, MAX_RANK) for d in space.adapters[UNIFORM_MIX]]


def rotated(
    steps: dict[str, Callable[[], object]], sides: tuple[str, ...], rounds: int, calls: int
) -> dict[str, list[float]]:
    """Per side, thread ms per step in each round; rounds rotate the order (ABC, CBA), each
    side warmed up by one step after the other sides ran."""
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    for i in range(rounds):
        for name in sides if i % 2 == 0 else reversed(sides):
            steps[name]()
            cpu[name].append(timed(steps[name], calls)[0])
    return cpu


def ratio_summary(num: list[float], den: list[float]) -> dict[str, float]:
    ratios = [n / d for n, d in zip(num, den, strict=True)]
    return {
        "median": round(statistics.median(ratios), 4),
        "min": round(min(ratios), 4),
        "max": round(max(ratios), 4),
    }


def breakdown(
    pool: LoraSlotPool, step: Callable[[], object], steps: int, rows: int
) -> dict[str, float]:
    """Thread ms per step inside ``prepare`` and each module's ``apply``; then the applies
    swept outside a step, cold and hot."""
    spent: dict[str, float] = defaultdict(float)
    apply, prepare = pool.apply, pool.prepare

    def timed_apply(layer: int, module: str, *args: object) -> torch.Tensor:
        started = time.thread_time()
        out = apply(layer, module, *args)  # type: ignore[arg-type]
        spent[module] += time.thread_time() - started
        return out

    def timed_prepare(token_slots: torch.Tensor) -> object:
        started = time.thread_time()
        batch = prepare(token_slots)
        spent["prepare"] += time.thread_time() - started
        return batch

    pool.apply, pool.prepare = timed_apply, timed_prepare  # type: ignore[method-assign,assignment]
    for _ in range(steps):
        step()
    pool.apply, pool.prepare = apply, prepare  # type: ignore[method-assign]
    result = {k: round(v * 1e3 / steps, 3) for k, v in sorted(spent.items())}
    keys = [key for key in sorted(pool._tables) if key[1] in ATTENTION]
    batch = pool.prepare(torch.tensor([i % ADAPTERS for i in range(rows)]))
    io = {}
    for module in ATTENTION:
        view = pool.module_weights(0, module)
        io[module] = (
            torch.randn(rows, view.lora_a.shape[1]),
            torch.zeros(rows, view.lora_b.shape[1]),
        )
    evict = torch.zeros(32 << 20)  # 128 MiB, more than any cache
    cold, hot = [], []
    for _ in range(steps):
        evict.add_(1.0)
        started = time.thread_time()
        for layer, module in keys:
            pool.apply(layer, module, *io[module], batch)
        cold.append(time.thread_time() - started)
        started = time.thread_time()
        for _layer, module in keys:
            pool.apply(0, module, *io[module], batch)
        hot.append(time.thread_time() - started)
    result["sweep_cold_ms"] = round(statistics.median(cold) * 1e3, 3)
    result["sweep_hot_ms"] = round(statistics.median(hot) * 1e3, 3)
    return result


def main() -> None:
    args, heap_kept, load_start = start(8, batch=True)
    with tempfile.TemporaryDirectory() as tmp:
        runner, weights = r16_setup(Path(tmp), args.preset)
        pool = runner.pool(weights, "auto", MAX_RANK)
        shape = StepShape(args.batch, 1, CONTEXT)
        r16 = runner.step(shape, [i % ADAPTERS for i in range(args.batch)], pool)
        steps = {"base": runner.step(shape, None, None), "r16_rebuilt": rebuilt(pool, r16)}
        steps["r16"] = r16
        logits = {name: torch.as_tensor(step()) for name, step in steps.items()}
        same = bool(torch.equal(logits["r16"], logits["r16_rebuilt"]))
        cpu = rotated(steps, SIDES, args.rounds, args.calls)
        parts = {name: breakdown(pool, steps[name], 6, args.batch) for name in SIDES[1:]}
    result = {
        "name": "lora-overhead-paired",
        "config": {
            "preset": args.preset,
            "rounds": args.rounds,
            "calls": args.calls,
            "batch": args.batch,
        },
        "heap_kept": heap_kept,
        "loadavg_start": load_start,
        "r16_logits_equal": same,
        "strategy": pool.last_strategy,
        "thread_ms": {name: round(statistics.median(cpu[name]), 2) for name in SIDES},
        "base/r16_rebuilt": ratio_summary(cpu["base"], cpu["r16_rebuilt"]),
        "base/r16": ratio_summary(cpu["base"], cpu["r16"]),
        "r16/r16_rebuilt": ratio_summary(cpu["r16"], cpu["r16_rebuilt"]),
        "breakdown_ms": parts,
        "loadavg_end": Path("/proc/loadavg").read_text().split()[:3],
    }
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
