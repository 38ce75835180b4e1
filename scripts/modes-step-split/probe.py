"""Where an 80 %-skewed step's time goes, merged vs unmerged (issue 28; docs/modes.md, eighth
pass).

On ``bench modes``' setup and its skewed batch (20 sequences, 16 on the hot revision), five
variants of a decode step and of a prefill step, interleaved ABBA (5 calls a round, 3 warm-up
calls each), medians per call: ``base`` (no LoRA), ``unmerged``, ``merged`` (the hot revision
folded in, the fused negative pass), ``merged_dtype`` (the same with the float32 pass of 16-bit
CPU steps turned off, ``float32_max_tokens=0``: the merged step before docs/modes.md's
eleventh pass; identical to ``merged`` in float32) and ``free_negative`` (the hot sequences
on the base model, unmerged: the ceiling of any merged execution). For each, the whole step
and the LoRA part (the applier's ``prepare`` and every ``apply``, timed around the calls inside
the step).
Every variant runs while the hot revision is merged (timing only: the values do not matter).

Prints one JSON line. Run niced under the benchmark lock, e.g.
``flock /work/bench.lock nice -n -5 python scripts/modes-step-split/probe.py small float32 5``
(arguments: preset, dtype, rounds, optional context tokens, default 64).
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from loraplex.bench.modes.figures import hot_as_base, skewed_slots
from loraplex.bench.modes.setup import HOT, ModesBenchConfig, Setup, decode_step, prefill_step
from loraplex.model.llama import LoraApplier
from loraplex.model.merge import MergedLoraApplier
from loraplex.ops import LoraBatch


class Timed:
    """An applier whose LoRA calls add up their seconds."""

    def __init__(self, inner: LoraApplier) -> None:
        self.inner, self.seconds = inner, 0.0

    @property
    def last_strategy(self) -> str:
        return self.inner.last_strategy

    def prepare(self, token_slots: torch.Tensor) -> LoraBatch:
        start = time.perf_counter()
        batch = self.inner.prepare(token_slots)
        self.seconds += time.perf_counter() - start
        return batch

    def apply(
        self, layer: int, module: str, x: torch.Tensor, out: torch.Tensor, batch: LoraBatch
    ) -> torch.Tensor:
        start = time.perf_counter()
        result = self.inner.apply(layer, module, x, out, batch)
        self.seconds += time.perf_counter() - start
        return result


def split(setup: Setup, make, slots: dict, appliers: dict, rounds: int) -> dict:  # type: ignore[no-untyped-def]
    steps = {name: make(setup, s) for name, s in slots.items()}
    names = list(slots)
    for name in names:
        for _ in range(3):
            steps[name](appliers[name])
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            applier = appliers[name]
            for _ in range(5):
                if applier is not None:
                    applier.seconds = 0.0
                start = time.perf_counter()
                steps[name](applier)
                seconds = time.perf_counter() - start
                samples[name].append((seconds, 0.0 if applier is None else applier.seconds))
    row: dict[str, dict[str, float]] = {}
    for name in names:
        row[name] = {
            "step_ms": statistics.median(s for s, _ in samples[name]) * 1000,
            "lora_ms": statistics.median(lora for _, lora in samples[name]) * 1000,
            "rest_ms": statistics.median(s - lora for s, lora in samples[name]) * 1000,
        }
    unmerged = row["unmerged"]["step_ms"]
    row["ratios"] = {
        "unmerged_over_base": unmerged / row["base"]["step_ms"],
        "lora_fraction_of_unmerged_step": row["unmerged"]["lora_ms"] / unmerged,
        "merged_over_unmerged_tps": unmerged / row["merged"]["step_ms"],
        "merged_over_merged_dtype_tps": row["merged_dtype"]["step_ms"] / row["merged"]["step_ms"],
        "free_negative_over_unmerged_tps": unmerged / row["free_negative"]["step_ms"],
    }
    return row


def main() -> None:
    preset, dtype, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ctx = int(sys.argv[4]) if len(sys.argv) > 4 else 64
    torch.set_num_threads(1)
    cfg = ModesBenchConfig(
        preset=preset, dtype=dtype, batch_size=20, rounds=rounds, context_tokens=ctx
    )
    out: dict[str, object] = {
        "preset": preset,
        "dtype": dtype,
        "rounds": rounds,
        "context_tokens": ctx,
        "calls_per_round": 5,
    }
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        setup = Setup(Path(tmp), cfg)
        skewed = skewed_slots(random.Random(cfg.seed), 20, 0.8)  # bench modes' first draw
        out["foreign_slots"] = [s for s in skewed if s != HOT]
        merged = setup.merge(HOT)
        merged_dtype = MergedLoraApplier(setup.pool, HOT, setup.negative, float32_max_tokens=0)
        slots = {
            "base": skewed,
            "unmerged": skewed,
            "merged": skewed,
            "merged_dtype": skewed,
            "free_negative": hot_as_base(skewed),
        }
        for kind, make in (("decode", decode_step), ("prefill", prefill_step)):
            appliers = {
                "base": None,
                "unmerged": Timed(setup.pool),
                "merged": Timed(merged),
                "merged_dtype": Timed(merged_dtype),
                "free_negative": Timed(setup.pool),
            }
            out[kind] = split(setup, make, slots, appliers, rounds)
        setup.unmerge()
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
