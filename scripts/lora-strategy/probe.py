"""Which LoRA strategy is fastest on the unmerged op's decode and prefill steps, per dtype and
preset width, and does ``auto`` pick it? (issues 27 / 28; docs/modes.md, thirteenth pass).

On ``bench modes``' setup (16 random adapters, ranks 8-64, every target module): decode steps
of n sequences (``--sizes``, default 16, 20, 24, 32) in two mixes, ``skewed80`` (``round(0.8
n)`` on the hot slot, the rest drawn as ``bench modes`` draws them) and ``uniform16`` (sequence
i on slot i mod 16), and one prefill step of ``--prefill`` sequences (each its whole
``context_tokens`` prompt; skewed80 mix). Variants, each the unmerged pool under another
backend: ``masked``, ``grouped`` (forced, in the dtype), ``batched`` (forced: one row grid or
one per rank class), ``auto`` (the tree's ``auto``) and ``grouped_f32`` (grouped, in float32
through the gathered pass on every step of two runs or more, no token cap; equal to
``grouped`` in float32). Paired ABBA: each round times every variant ``calls`` steps in turn,
the order reversed every other round; per variant the median whole step (ms) with min-max over
the rounds' medians, and ``auto``'s strategy; per step the fastest variant and ``auto`` over it
(step-time ratio best / auto: 1.0 = auto is the best). Times are wall clock, or with ``--clock
thread`` the thread's CPU time (which other processes on a shared machine leave alone).

Prints one JSON line per (preset, dtype). Run niced under the benchmark lock, e.g.
``flock /work/bench.lock nice -n -5 python scripts/lora-strategy/probe.py small bfloat16 4``
(arguments: preset, dtype, rounds; options ``--sizes 16,20`` ``--prefill 4`` ``--calls 3``
``--clock thread``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from loraplex.bench.modes.figures import skewed_slots
from loraplex.bench.modes.setup import (
    NUM_ADAPTERS,
    BackendView,
    ModesBenchConfig,
    Setup,
    decode_step,
    prefill_step,
)
from loraplex.ops import ArenaLayout, LoraBatch
from loraplex.ops.plan import active_slot_tokens, check_token_slots, gathered_batch
from loraplex.ops.torch_ops import GroupedBackend

CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}
VARIANTS = ("masked", "grouped", "batched", "auto", "grouped_f32")


class GroupedFloat32(GroupedBackend):
    """Grouped over the gathered tokens, in float32, on every step of two runs or more."""

    def prepare(self, token_slots: torch.Tensor, layout: ArenaLayout) -> LoraBatch:
        check_token_slots(token_slots, len(layout.slot_rows))
        tokens = active_slot_tokens(token_slots, layout)
        if len(tokens) > 1 and layout.row_scale.element_size() == 2:
            return gathered_batch(token_slots, layout, list(tokens), float32=True)
        return super().prepare(token_slots, layout)


def views(setup: Setup) -> dict[str, BackendView]:
    out = {name: BackendView(setup.pool, name) for name in VARIANTS[:4]}
    out["grouped_f32"] = BackendView(setup.pool, "grouped")
    out["grouped_f32"].backend = GroupedFloat32()
    return out


def measure(
    make: Callable[[Setup, list[int | None]], Callable[[BackendView | None], None]],
    setup: Setup,
    slots: list[int | None],
    rounds: int,
    calls: int,
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, object]:
    step = make(setup, slots)
    appliers = views(setup)
    for applier in appliers.values():
        step(applier)
        step(applier)
    per_round: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for index in range(rounds):
        for name in VARIANTS if index % 2 == 0 else VARIANTS[::-1]:  # ABBA
            times = []
            for _ in range(calls):
                start = clock()
                step(appliers[name])
                times.append(clock() - start)
            per_round[name].append(statistics.median(times) * 1000)
    row: dict[str, object] = {"slots": slots, "auto_chose": appliers["auto"].last_strategy}
    medians = {name: statistics.median(ms) for name, ms in per_round.items()}
    for name in VARIANTS:
        row[name] = {
            "step_ms": medians[name],
            "min_ms": min(per_round[name]),
            "max_ms": max(per_round[name]),
        }
    best = min(medians, key=lambda name: medians[name])
    row["best"] = best
    row["best_over_auto"] = medians[best] / medians["auto"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("preset")
    parser.add_argument("dtype")
    parser.add_argument("rounds", type=int)
    parser.add_argument("--sizes", default="16,20,24,32")
    parser.add_argument("--prefill", type=int, default=4)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall")
    args = parser.parse_args()
    clock = CLOCKS[args.clock]
    torch.set_num_threads(1)
    cfg = ModesBenchConfig(preset=args.preset, dtype=args.dtype, batch_size=20)
    out: dict[str, object] = {
        "probe": "lora-strategy",
        "preset": args.preset,
        "dtype": args.dtype,
        "rounds": args.rounds,
        "calls": args.calls,
        "clock": args.clock,
        "start_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg_start": Path("/proc/loadavg").read_text().split()[:3],
    }
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        setup = Setup(Path(tmp), cfg)
        rng = random.Random(cfg.seed)
        for n in (int(size) for size in args.sizes.split(",")):
            skewed = skewed_slots(rng, n, 0.8)
            uniform: list[int | None] = [i % NUM_ADAPTERS for i in range(n)]
            out[f"decode_skewed80_{n}"] = measure(
                decode_step, setup, skewed, args.rounds, args.calls, clock=clock
            )
            out[f"decode_uniform16_{n}"] = measure(
                decode_step, setup, uniform, args.rounds, args.calls, clock=clock
            )
        if args.prefill:
            slots = skewed_slots(rng, args.prefill, 0.8)
            out[f"prefill_skewed80_{args.prefill}"] = measure(
                prefill_step, setup, slots, max(2, args.rounds // 2), 1, clock=clock
            )
    out["end_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
