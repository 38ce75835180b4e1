"""Is merged's single-revision gap to base its ``prepare``? (issue 28, tenth pass)

``bench modes``' setup, all ``--batch-size`` sequences on the hot revision, the hot revision
merged, timed like the bench's trio (``paired_rounds``: ``--rounds`` rounds, ``--blocks``
blocks per sample each settled by one untimed call, samples at least ``--sample-ms``):
``merged`` (the applier: ``prepare`` inside the forward, then no LoRA call), ``base`` (no
applier), ``base_again`` (the A/A control) and ``base_prepare`` (the applier's ``prepare`` on
the step's token slots, then the base step: merged's work, the prepare outside the forward).
Prints one JSON line of per-round paired ratios over base (median, min, max). Run under the
benchmark lock: ``flock /work/bench.lock nice -n -5 python
scripts/modes-single-paired/prepare_in_step.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from loraplex.bench.execution.timing import paired_rounds
from loraplex.bench.modes.setup import HOT, ModesBenchConfig, Setup, decode_step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--sample-ms", type=float, default=150.0)
    parser.add_argument("--blocks", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = ModesBenchConfig(dtype=args.dtype, batch_size=args.batch_size)
    with tempfile.TemporaryDirectory() as tmp:
        setup = Setup(Path(tmp), config)
        step = decode_step(setup, [HOT] * args.batch_size)
        merged = setup.merge(HOT)
        slots = torch.as_tensor([HOT] * args.batch_size, dtype=torch.int64)

        def base_prepare() -> None:
            merged.prepare(slots)
            step(None)

        timed = paired_rounds(
            {
                "base_prepare": base_prepare,
                "merged": lambda: step(merged),
                "base": lambda: step(None),
                "base_again": lambda: step(None),
            },
            rounds=args.rounds,
            min_sample_s=args.sample_ms / 1000,
            blocks=args.blocks,
            settle_calls=1,
        )
    line = {
        "name": "modes-prepare-in-step",
        "config": {**vars(args), "threads": 1},
        "calls_per_block": timed.calls,
        **{
            f"{n}_over_base": timed.ratio(n, "base")
            for n in ("merged", "base_prepare", "base_again")
        },
        "merged_over_base_prepare": timed.ratio("merged", "base_prepare"),
        "step_ms": {k: v * 1e3 for k, v in timed.medians().items()},
    }
    sys.stdout.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
