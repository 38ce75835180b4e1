"""Whole decode step, batched per rank class against grouped (issue 27 item 2; execution.md,
"Per class against grouped, settled").

``bench execution``'s setup (its random base of the preset, 16 distinct S2 adapters on q/k/v/o,
loaded round-robin into one pool per backend, the server's paged KV cache, 64 cached
positions), float32, one thread. For each decode batch size: ``base`` (no LoRA), ``grouped``
and ``per_class`` (the ``batched`` backend, which runs per rank class on S2), in the
benchmark's token order (sequence i on adapter i % 16); at batch sizes above 16 also both in
the server's order (``engine/runner.by_slot``: each adapter's tokens side by side),
``grouped_sorted`` / ``per_class_sorted``. With ``r16``, 16 distinct rank-16 adapters too:
``r16_batched`` (one grid) and ``r16_grouped``.

Rounds alternate order (ABBA), each variant ``calls`` steps a round after 3 warm-up steps; per
round both the thread CPU time and the wall clock. Reports medians per step, ratios over base,
per-round paired ratios (per class time / grouped time: below 1 = per class faster) with their
min-max and win count, and what ``auto`` chooses for each step (its strategy and, for batched,
how many block groups).

Prints one JSON line. Run under the benchmark lock, e.g.
``flock /work/bench.lock nice -n -5 env PYTHONPATH=$PWD python scripts/per-class-step/probe.py
--preset large --batches 16,32 --rounds 20`` (about 4 minutes on large on 2 shared cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from loraplex.bench.execution.runners import LoraplexRunner, StepShape
from loraplex.bench.execution.setup import MAX_RANK, UNIFORM_MIX, Workspace
from loraplex.engine.heap import keep_freed_heap
from loraplex.model.lora import LoraSlotPool, OpTimer

ADAPTERS = 16
CONTEXT = 64


class ThreadTimer(OpTimer):
    """The pool's op timer on the thread CPU clock: the LoRA part (``prepare`` and every
    ``apply``) inside the whole step. Every LoRA pool carries one alike."""

    def start(self) -> float:
        return time.thread_time()

    def stop(self, started: float) -> None:
        self.seconds += time.thread_time() - started


def timed_rounds(
    variants: dict[str, Callable[[], object]],
    timers: dict[str, OpTimer],
    rounds: int,
    calls: int,
) -> dict[str, list[tuple[float, float, float]]]:
    """Per variant, per round: (thread, wall, LoRA thread) seconds per step; ABBA order."""
    for fn in variants.values():
        for _ in range(3):
            fn()
    names = list(variants)
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            fn, timer = variants[name], timers.get(name)
            if timer is not None:
                timer.seconds = 0.0
            cpu, wall = time.thread_time(), time.perf_counter()
            for _ in range(calls):
                fn()
            cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
            lora = 0.0 if timer is None else timer.seconds
            samples[name].append((cpu / calls, wall / calls, lora / calls))
    return samples


def auto_choice(pool: LoraSlotPool, slots: list[int]) -> str:
    """The strategy ``auto`` runs for a step over ``slots`` (``batched/<groups>`` per class)."""
    batch = pool.prepare(torch.tensor(slots, dtype=torch.int64))
    name = batch.strategy.value
    if batch.classes is not None:
        name += f"/{len(batch.classes.groups)}-groups"
    return name


def summary(samples: dict[str, list[tuple[float, float, float]]]) -> dict[str, object]:
    out: dict[str, object] = {
        "lora_thread_ms": {
            name: round(statistics.median(s[2] for s in v) * 1000, 2)
            for name, v in samples.items()
            if name != "base"
        }
    }
    for clock, index in (("thread", 0), ("wall", 1)):
        base = statistics.median(s[index] for s in samples["base"])
        medians = {name: statistics.median(s[index] for s in v) for name, v in samples.items()}
        out[f"{clock}_ms"] = {name: round(m * 1000, 2) for name, m in medians.items()}
        out[f"{clock}_over_base"] = {
            name: round(base / m, 4) for name, m in medians.items() if name != "base"
        }
        pairs: dict[str, object] = {}
        for a, b in (
            ("per_class", "grouped"),
            ("per_class_sorted", "grouped_sorted"),
            ("r16_batched", "r16_grouped"),
        ):
            if a in samples and b in samples:
                ratios = [x[index] / y[index] for x, y in zip(samples[a], samples[b], strict=True)]
                pairs[f"{a}/{b}"] = {
                    "median": round(statistics.median(ratios), 4),
                    "min": round(min(ratios), 4),
                    "max": round(max(ratios), 4),
                    "a_faster_rounds": sum(r < 1 for r in ratios),
                    "rounds": len(ratios),
                }
        out[f"{clock}_paired"] = pairs
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="large")
    parser.add_argument("--batches", default="16,32")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--r16", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    heap_kept = keep_freed_heap()
    batches = [int(b) for b in args.batches.split(",")]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    result: dict[str, object] = {
        "name": "per-class-step",
        "config": {
            "preset": args.preset,
            "batches": batches,
            "rounds": args.rounds,
            "calls": args.calls,
            "r16": args.r16,
            "dtype": "float32",
            "threads": torch.get_num_threads(),
            "heap_kept": heap_kept,
            "commit": commit,
            "loadavg_start": Path("/proc/loadavg").read_text().split()[:3],
        },
    }
    with tempfile.TemporaryDirectory() as tmp:
        mixes = ("S2", UNIFORM_MIX) if args.r16 else ("S2",)
        space = Workspace.create(Path(tmp), args.preset, ADAPTERS, 0, mixes)
        runner = LoraplexRunner(
            space.model_dir, torch.float32, max(batches), CONTEXT + 64, torch.device("cpu")
        )
        s2 = [runner.weights(d, MAX_RANK) for d in space.adapters["S2"][:ADAPTERS]]
        pools = {name: runner.pool(s2, name, MAX_RANK) for name in ("grouped", "batched", "auto")}
        if args.r16:
            r16 = [runner.weights(d, MAX_RANK) for d in space.adapters[UNIFORM_MIX][:ADAPTERS]]
            pools["r16_batched"] = runner.pool(r16, "batched", MAX_RANK)
            pools["r16_grouped"] = runner.pool(r16, "grouped", MAX_RANK)
            pools["r16_auto"] = runner.pool(r16, "auto", MAX_RANK)
        clocks = {name: ThreadTimer(torch.device("cpu")) for name in pools}
        for name, pool in pools.items():
            pool.op_timer = clocks[name]
        per_batch: dict[str, object] = {}
        for batch in batches:
            shape = StepShape(batch, 1, CONTEXT)
            bench_order = [i % ADAPTERS for i in range(batch)]
            sorted_order = sorted(bench_order)
            plan = {"grouped": ("grouped", bench_order), "per_class": ("batched", bench_order)}
            if sorted_order != bench_order:
                plan["grouped_sorted"] = ("grouped", sorted_order)
                plan["per_class_sorted"] = ("batched", sorted_order)
            if args.r16:
                plan["r16_batched"] = ("r16_batched", bench_order)
                plan["r16_grouped"] = ("r16_grouped", bench_order)
            timers: dict[str, OpTimer] = {}
            variants: dict[str, Callable[[], object]] = {"base": runner.step(shape, None, None)}
            for name, (pool_name, order) in plan.items():
                timers[name] = clocks[pool_name]
                variants[name] = runner.step(shape, order, pools[pool_name])
            auto = {"s2": auto_choice(pools["auto"], bench_order)}
            if args.r16:
                auto["r16"] = auto_choice(pools["r16_auto"], bench_order)
            samples = timed_rounds(variants, timers, args.rounds, args.calls)
            per_batch[str(batch)] = {"auto": auto, **summary(samples)}
        result["batches"] = per_batch
    result["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
