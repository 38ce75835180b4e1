"""Does the unmerged ``auto`` op gain from the float32 pass of few-token 16-bit CPU steps?
(issue 28; docs/modes.md, twelfth pass).

On ``bench modes``' setup (16 random adapters, ranks 8-64, every target module), decode steps of
``n`` sequences for n in 1, 2, 4, 8, 12, 16 and 20, two token mixes: ``skewed80``
(``round(0.8 n)`` sequences on the hot slot, the rest on other slots drawn as ``bench modes``
draws them) and ``distinct`` (every sequence on its own slot, slots reused past 16). Three
variants of the unmerged ``auto`` op, interleaved ABC CBA (5 calls a round after 3 warm-up
calls each): ``dtype`` (``AutoBackend(float32_max_tokens=0)``: the op before the twelfth pass),
``float32`` (the merged op's rule as it reads: the float32 pass on every step of at most 64
adapter tokens, masked steps and single runs too) and ``float32_grouped`` (the op's rule since
the twelfth pass: only in place of grouped, over two runs or more; ``float32_max_tokens=64``,
so n = 20 shows what the cap of 16 leaves out). For each, the median whole step and its LoRA
part (``prepare`` and every ``apply``, timed around the calls inside the step), ms, and the
strategy each chose.

Prints one JSON line. Run niced under the benchmark lock, e.g.
``flock /work/bench.lock nice -n -5 python scripts/unmerged-float32/probe.py small bfloat16 6``
(arguments: preset, dtype, rounds).
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

from loraplex.bench.modes.figures import skewed_slots
from loraplex.bench.modes.setup import (
    NUM_ADAPTERS,
    BackendView,
    ModesBenchConfig,
    Setup,
    decode_step,
)
from loraplex.ops import ArenaLayout, LoraBatch
from loraplex.ops.plan import active_slot_tokens, check_token_slots, gathered_batch, runs_in_float32
from loraplex.ops.torch_ops import AutoBackend

SIZES = (1, 2, 4, 8, 12, 16, 20)


class Timed:
    """A backend view whose LoRA calls add up their seconds."""

    def __init__(self, view: BackendView) -> None:
        self.view, self.seconds = view, 0.0

    @property
    def last_strategy(self) -> str:
        return self.view.last_strategy

    def prepare(self, token_slots: torch.Tensor) -> LoraBatch:
        start = time.perf_counter()
        batch = self.view.prepare(token_slots)
        self.seconds += time.perf_counter() - start
        return batch

    def apply(
        self, layer: int, module: str, x: torch.Tensor, out: torch.Tensor, batch: LoraBatch
    ) -> torch.Tensor:
        start = time.perf_counter()
        result = self.view.apply(layer, module, x, out, batch)
        self.seconds += time.perf_counter() - start
        return result


class Ungated(AutoBackend):
    """The float32 pass on every step of at most ``float32_max_tokens`` adapter tokens, as the
    merged op's rule reads (masked steps and single runs too): the ``float32`` variant."""

    def prepare(self, token_slots: torch.Tensor, layout: ArenaLayout) -> LoraBatch:
        check_token_slots(token_slots, len(layout.slot_rows))
        tokens = active_slot_tokens(token_slots, layout)
        if tokens and runs_in_float32(sum(tokens.values()), layout, self.float32_max_tokens):
            return gathered_batch(token_slots, layout, list(tokens), float32=True)
        return super().prepare(token_slots, layout)


def variant(setup: Setup, backend: AutoBackend) -> Timed:
    view = BackendView(setup.pool, "auto")
    view.backend = backend
    return Timed(view)


def measure(setup: Setup, slots: list[int | None], rounds: int) -> dict[str, object]:
    step = decode_step(setup, slots)
    appliers = {
        "dtype": variant(setup, AutoBackend(float32_max_tokens=0)),
        "float32": variant(setup, Ungated(float32_max_tokens=64)),
        "float32_grouped": variant(setup, AutoBackend(float32_max_tokens=64)),
    }
    names = list(appliers)
    for name in names:
        for _ in range(3):
            step(appliers[name])
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:  # ABC CBA
            applier = appliers[name]
            for _ in range(5):
                applier.seconds = 0.0
                start = time.perf_counter()
                step(applier)
                samples[name].append((time.perf_counter() - start, applier.seconds))
    row: dict[str, object] = {"slots": slots}
    for name in names:
        row[name] = {
            "step_ms": statistics.median(s for s, _ in samples[name]) * 1000,
            "lora_ms": statistics.median(lora for _, lora in samples[name]) * 1000,
            "strategy": appliers[name].last_strategy,
        }
    dtype, float32 = row["dtype"], row["float32"]
    assert isinstance(dtype, dict) and isinstance(float32, dict)
    grouped = row["float32_grouped"]
    assert isinstance(grouped, dict)
    row["lora_dtype_over_float32"] = dtype["lora_ms"] / float32["lora_ms"]
    row["step_dtype_over_float32"] = dtype["step_ms"] / float32["step_ms"]
    row["step_dtype_over_float32_grouped"] = dtype["step_ms"] / grouped["step_ms"]
    return row


def main() -> None:
    preset, dtype, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    cfg = ModesBenchConfig(preset=preset, dtype=dtype, batch_size=20, rounds=rounds)
    out: dict[str, object] = {"preset": preset, "dtype": dtype, "rounds": rounds}
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        setup = Setup(Path(tmp), cfg)
        rng = random.Random(cfg.seed)
        for n in SIZES:
            mixes: dict[str, list[int | None]] = {
                "skewed80": skewed_slots(rng, n, 0.8),
                "distinct": [i % NUM_ADAPTERS for i in range(n)],
            }
            for mix, slots in mixes.items():
                out[f"{mix}_{n}"] = measure(setup, slots, rounds)
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
